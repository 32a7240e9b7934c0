# syntax=docker/dockerfile:1
# The operator image: a static (musl) release build, run from distroless/static as a non-root
# user. Static because a mapped glibc is 1.5 MiB of the operator's resident memory (make bench).
#
# Built for linux/amd64 and linux/arm64 (make docker-buildx builds both). The builder stage
# compiles for its own architecture, so each platform is built natively: on a builder node of
# that architecture, or under QEMU emulation, which is correct but several times slower.
#
# Needs BuildKit (the cache mounts below are `RUN --mount`): Docker 23 and later use it by
# default, as does `docker buildx`; with an older Docker, build with DOCKER_BUILDKIT=1.
#
# Base images are pinned so that a rebuild of the same commit builds the same thing. To bump:
# the builder follows Cargo.toml's rust-version (tests/packaging.rs holds them together), so
# raise both, then `make test`; distroless publishes no version tags, only the Debian release in
# its name (static-debian12), so move to the next release's name when it comes, or pin the bytes
# with `@sha256:...` from `docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot`.

FROM rust:1.88-bookworm AS builder
# Set by BuildKit for every build (amd64, arm64): keeps each architecture's target dir apart.
ARG TARGETARCH
# ring's C and assembly are compiled by the cc crate, which for a musl target looks for
# `<arch>-linux-musl-gcc`. Debian's musl-dev ships that wrapper for the machine's own
# architecture, and musl-tools names it `musl-gcc`; naming musl-gcc here makes the compiler the
# same on both architectures whatever cc's per-target defaults become.
ENV CC_x86_64_unknown_linux_musl=musl-gcc \
    CC_aarch64_unknown_linux_musl=musl-gcc
# Any other architecture would need its own CC_ line above and a Rust musl target named after
# `uname -m` (armv7l has none): say so instead of failing somewhere in the build.
RUN case "$(uname -m)" in \
        x86_64|aarch64) ;; \
        *) echo "the image builds on x86_64 and aarch64, not $(uname -m)" >&2; exit 1 ;; \
    esac \
    && apt-get update && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
# The whole workspace (minus what .dockerignore drops): cargo needs every member's Cargo.toml
# (testserver/ is one) to resolve the workspace, even to build just the operator.
COPY . .
# Cache mounts keep the registry and the target dir between builds, so a source change rebuilds
# only this workspace's crates, not the dependencies. The binary is copied out of the target
# mount because cache mounts are not part of the image. A cache mount is shared by every
# platform of a multi-platform build unless its id differs, so the target dir (which holds the
# build scripts compiled for the builder's own architecture) gets one per architecture; the
# registry holds only sources and is shared, locked so one cargo writes it at a time.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,id=immortal-operator-target-${TARGETARCH},sharing=locked \
    target="$(uname -m)-unknown-linux-musl" \
    && cargo build --release --locked --target "$target" --bin immortal-operator \
    && cp "target/$target/release/immortal-operator" /immortal-operator

# static: no libc at all, only CA certificates (read when a kubeconfig names no CA), tzdata and
# /etc/passwd. The nonroot variant's user is 65532, the uid the Deployment's securityContext asks for.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=builder /immortal-operator /immortal-operator
USER 65532:65532
ENTRYPOINT ["/immortal-operator"]
