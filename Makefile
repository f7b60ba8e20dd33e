# The README's two commands: `make demo` and `make test`.
GO ?= go

# Every module of the repository: the library (with the demo), the load
# benchmark, and the container launcher the test harness runs. Each has its
# own go.mod so that importers of the library see none of the others'
# dependencies.
MODULES := . loadtest internal/pgcontainer pglimitgrpc pglimitotel pglimitorm pglimitriver

.PHONY: demo test test-short test-matrix bench fmt vet lint

# Built, then run, so that Ctrl-C reaches the demo itself, which stops
# cleanly on SIGINT (it drains its requests and exits 0). make receives the
# same Ctrl-C and reports it as an interrupt whatever the demo did: the
# shell then shows exit status 130, as for any interrupted make.
DEMO_BIN ?= $(or $(TMPDIR),/tmp)/pglimit-demo

demo:
	@echo "make demo: building the demo (a first build downloads and compiles its dependencies, about a minute)"
	@$(GO) build -o $(DEMO_BIN) ./demo
	@$(DEMO_BIN)

# every runs $(2) in each module ($$m), announced as $(1): in all of them,
# even after one fails, with its output shown as it comes. Then it lists
# what failed, each module with its failing tests and packages (or the
# last lines of its output), and fails if anything did.
every = log=$$(mktemp -d); failed=""; \
	for m in $(MODULES); do \
		echo "$(1) $$m"; \
		{ $(2); echo $$? >"$$log/rc"; } 2>&1 | tee "$$log/out"; \
		if [ "$$(cat "$$log/rc")" != 0 ]; then \
			failed="$$failed $$m"; \
			echo "$$m:" >>"$$log/failures"; \
			{ grep -E '^(--- FAIL|FAIL[[:space:]]|panic:)' "$$log/out" || tail -n 5 "$$log/out"; } | sed 's/^/    /' >>"$$log/failures"; \
		fi; \
	done; \
	if [ -n "$$failed" ]; then \
		echo; echo "$(1) failed in$$failed:"; cat "$$log/failures"; rm -rf "$$log"; exit 1; \
	fi; \
	rm -rf "$$log"

test:
	@$(call every,go test,$(GO) -C $$m test -race -shuffle=on -count=1 -timeout 30m ./...)

# The quick tier, for iterating: -short skips what restarts, crashes or
# cuts off a server, fails over, drains a backlog or reruns a whole suite
# in another setting (testdb.Slow), and -race is off. make test runs all.
test-short:
	@$(call every,go test -short,$(GO) -C $$m test -short -shuffle=on -count=1 -timeout 10m ./...)

# The conformance suite against every supported PostgreSQL major, from local
# binaries (and through testcontainers when a Docker engine answers).
test-matrix:
	bash .ci/matrix.sh

bench:
	$(GO) -C loadtest run . -short

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	@$(call every,go vet,$(GO) -C $$m vet ./...)

# staticcheck, at the version CI runs, from the module proxy (nothing in
# go.mod): its configuration is staticcheck.conf.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	@$(call every,staticcheck,$(GO) -C $$m run $(STATICCHECK) ./...)
