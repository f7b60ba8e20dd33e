# The demo service (docker-compose.yml builds it for both instances).
# Build stage: a static binary, no cgo.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/demo ./demo

# Run stage: nothing but the binary, as an unprivileged user. DATABASE_URL
# must be set: the throwaway PostgreSQL of `go run ./demo` needs local
# PostgreSQL binaries, which this image does not have.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/demo /demo
EXPOSE 8080
ENV PGLIMIT_DEMO_ADDR=:8080
USER nonroot:nonroot
ENTRYPOINT ["/demo"]
