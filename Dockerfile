# syntax=docker/dockerfile:1
# The operator image: a static (musl) release build, run from distroless/static as a non-root
# user. Static because a mapped glibc is 1.5 MiB of the operator's resident memory (make bench).

FROM rust:1-bookworm AS builder
# musl-gcc compiles ring's C and assembly for the musl target; the target matches the build
# machine's architecture (x86_64 or aarch64), so the image builds natively on either.
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/* \
    && rustup target add "$(uname -m)-unknown-linux-musl"
WORKDIR /src
# The whole workspace (minus what .dockerignore drops): cargo needs every member's Cargo.toml
# (testserver/ is one) to resolve the workspace, even to build just the operator.
COPY . .
# Cache mounts keep the registry and the target dir between builds, so a source change rebuilds
# only this workspace's crates, not the dependencies. The binary is copied out of the target
# mount because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    target="$(uname -m)-unknown-linux-musl" \
    && cargo build --release --locked --target "$target" --bin immortal-operator \
    && cp "target/$target/release/immortal-operator" /immortal-operator

# static: no libc at all, only CA certificates (read when a kubeconfig names no CA), tzdata and
# /etc/passwd. The nonroot variant's user is 65532, the uid the Deployment's securityContext asks for.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=builder /immortal-operator /immortal-operator
USER 65532:65532
ENTRYPOINT ["/immortal-operator"]
