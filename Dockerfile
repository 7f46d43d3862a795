# syntax=docker/dockerfile:1
# Dockerfile - meshrun for GPU clusters: CUDA, cuBLAS and NCCL.
#
#   docker build --target agent      -t meshrun/meshrun-agent:0.1.0 .
#   docker build --target controller -t meshrun/meshrun-controller:0.1.0 .
#
# (`make image` prints and, where Docker or Buildah exists, runs these; the
# controller needs no GPU: Dockerfile.cpu builds a smaller one.)
# Build stage: the CUDA devel image (nvcc, cuBLAS, NCCL), `make install`;
# runtime stage: the matching CUDA runtime image (cudart, cuBLAS, NCCL) plus
# the shared libraries meshrun links (libcurl, jansson, PCRE2, libmicrohttpd,
# OpenBLAS) and the three binaries. Runs as uid 65532 with a read-only root
# filesystem: the only writable paths are mounted volumes (the controller's
# /var/lib/meshrun, the agent's /dev/shm, /tmp and checkpoints).
# The CUDA version is the one this project builds and tests with (13.0);
# package versions are pinned to their Ubuntu 24.04 upstream versions.
ARG CUDA_VERSION=13.0.1
ARG UBUNTU_VERSION=24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential=12.10* \
      pkg-config=1.8.1-* \
      libcurl4-openssl-dev=8.5.0-* \
      libjansson-dev=2.14-* \
      libpcre2-dev=10.42-* \
      libmicrohttpd-dev=0.9.77-* \
      libopenblas-dev=0.3.26+ds-* \
      libcriterion-dev=2.4.1-* \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sf /usr/include/nccl.h /usr/local/cuda/include/nccl.h \
 && ln -sf /usr/lib/x86_64-linux-gnu/libnccl.so /usr/local/cuda/lib64/libnccl.so
# (the Makefile finds NCCL under CUDA_HOME; the image has it under /usr)
WORKDIR /src
COPY Makefile ./
COPY scripts/deps.sh scripts/
COPY common common
COPY controller controller
COPY agent agent
COPY runtime runtime
COPY cli cli
RUN make -j"$(nproc)" DEPS=build BUILD=/src/build DESTDIR=/out PREFIX=/usr/local install

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION} AS runtime
ARG DEBIAN_FRONTEND=noninteractive
ARG VERSION=0.1.0
ARG REVISION=unknown
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libcurl4t64=8.5.0-* \
      libjansson4=2.14-* \
      libpcre2-8-0=10.42-* \
      libmicrohttpd12t64=0.9.77-* \
      libopenblas0-pthread=0.3.26+ds-* \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 meshrun \
 && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/meshrun \
      --no-create-home --shell /usr/sbin/nologin meshrun \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/meshrun
COPY --from=build /out/usr/local/bin/meshrun /out/usr/local/bin/meshrun-agent /out/usr/local/bin/meshrun-controller /usr/local/bin/
# the CUDA side (kernels, cuBLAS, NCCL), loaded by a process that opens a GPU
COPY --from=build /out/usr/local/lib/meshrun/meshrun-cuda.so /usr/local/lib/meshrun/
LABEL org.opencontainers.image.title="meshrun" \
      org.opencontainers.image.description="Kubernetes-native distributed-training job daemon: controller, agent, CLI (CUDA, NCCL)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}"
USER 65532:65532
WORKDIR /var/lib/meshrun
EXPOSE 29400 29401

FROM runtime AS controller
ENTRYPOINT ["/usr/local/bin/meshrun-controller"]
CMD ["--data-dir=/var/lib/meshrun"]

FROM runtime AS agent
ENTRYPOINT ["/usr/local/bin/meshrun-agent"]
