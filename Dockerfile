# syntax=docker/dockerfile:1
# The operator image: a release build on Debian bookworm, run from distroless as a non-root user.

FROM rust:1-bookworm AS builder
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
    cargo build --release --locked --bin immortal-operator \
    && cp target/release/immortal-operator /immortal-operator

# cc: glibc and libgcc_s, which the dynamically linked binary needs (ring needs nothing more).
# The nonroot variant's user is 65532, the same uid the Deployment's securityContext asks for.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /immortal-operator /immortal-operator
USER 65532:65532
ENTRYPOINT ["/immortal-operator"]
