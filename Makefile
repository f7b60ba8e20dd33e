# The README's two commands: `make demo` and `make test`.
GO ?= go

.PHONY: demo test bench fmt vet

demo:
	$(GO) run ./demo

test:
	$(GO) test -race -shuffle=on -count=1 ./...

bench:
	$(GO) run ./loadtest -short

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...
