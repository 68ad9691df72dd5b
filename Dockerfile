# sluice: a static binary on a distroless base, its entrypoint.
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" -t sluice:0.1.0 .
# Without Docker, scripts/image.sh builds an image of the same layout from
# scratch layers and runs it under podman (e2e/image_test.go compares the
# two and runs the demo in it with the root filesystem read-only).
# Base images are pinned: the Go toolchain by its exact release, the
# runtime by digest (distroless publishes no version tags; the tag beside
# the digest only says which image it is).
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY . .
ARG VERSION=dev
ARG REVISION=unknown
# Modules are fetched by the build itself, only those the binary needs (a
# `go mod download` layer would also fetch the tests' Helm and Kubernetes
# modules); the cache mounts keep them between builds.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath \
      -ldflags "-s -w -X main.version=$VERSION -X main.revision=$REVISION" \
      -o /out/sluice ./cmd/sluice

FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION"
COPY --from=build /out/sluice /usr/local/bin/sluice
# The base's /tmp (empty, world-writable) is the one path sluice writes to
# with a read-only root filesystem (a tmpfs or an emptyDir there), so it is
# the working directory: bulk-load --embedded writes its dead-letter file
# into the working directory.
WORKDIR /tmp
# distroless's nonroot user, by number: Kubernetes checks runAsNonRoot only
# against a numeric user.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sluice"]
