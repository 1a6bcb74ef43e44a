# jetway build, test and demo commands. `make test` is what CI runs.

GO       ?= go
BIN      := $(CURDIR)/bin
KUBE_VERSION := v1.36.3
KUBE_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 \
	-X k8s.io/component-base/version.gitMinor=36 \
	-X k8s.io/component-base/version.gitTreeState=clean
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

VERSION_LDFLAGS := -X github.com/jetway-ci/jetway/internal/buildinfo.Version=$(VERSION)

# The images `make image` writes: each a static binary alone, for the
# platform IMAGE_ARCH. IMAGE_REF names the step agent's in its tarball,
# GATEWAY_IMAGE_REF the gateway's. Both carry the commit's time as their
# created time, so the same commit gives the same digests.
IMAGE_ARCH        ?= $(shell $(GO) env GOARCH)
IMAGE_REF         ?= ghcr.io/jetway-ci/step-agent:$(VERSION)
GATEWAY_IMAGE_REF ?= ghcr.io/jetway-ci/gateway:$(VERSION)
STEP_AGENT_PKG    ?= ./cmd/step-agent
GATEWAY_PKG       ?= ./cmd/gateway
IMAGE_CREATED     ?= $(shell git log -1 --format=%cI 2>/dev/null || echo 1970-01-01T00:00:00Z)
IMAGE_REVISION    ?= $(shell git rev-parse HEAD 2>/dev/null)

# STATIC_BUILD builds a static linux/IMAGE_ARCH binary (add -o and the
# package); MKIMAGE packs one with the labels both images share.
STATIC_BUILD := CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -buildvcs=false \
	-ldflags "-s -w $(VERSION_LDFLAGS)"
MKIMAGE      := $(BIN)/mkimage -arch $(IMAGE_ARCH) -version $(VERSION) \
	-created $(IMAGE_CREATED) -revision "$(IMAGE_REVISION)"

# kwok's own manifests the integration clusters load: stages for node and
# pod lifecycles, and the CRDs of the kubelet API kwok serves (port-forward,
# exec, logs). A file added here is missing from an older bin/kwok-data, so
# make copies them all again.
KWOK_DATA_FILES := \
	kustomize/stage/node/fast/node-initialize.yaml \
	kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
	kustomize/stage/pod/fast/pod-ready.yaml \
	kustomize/stage/pod/fast/pod-complete.yaml \
	kustomize/stage/pod/fast/pod-delete.yaml \
	kustomize/crd/bases/kwok.x-k8s.io_portforwards.yaml \
	kustomize/crd/bases/kwok.x-k8s.io_clusterportforwards.yaml \
	kustomize/crd/bases/kwok.x-k8s.io_execs.yaml \
	kustomize/crd/bases/kwok.x-k8s.io_clusterexecs.yaml \
	kustomize/crd/bases/kwok.x-k8s.io_logs.yaml \
	kustomize/crd/bases/kwok.x-k8s.io_clusterlogs.yaml
KWOK_DATA := $(addprefix $(BIN)/kwok-data/,$(notdir $(KWOK_DATA_FILES)))

KUBE_BINS := $(BIN)/kube-apiserver $(BIN)/kube-scheduler $(BIN)/kube-controller-manager $(BIN)/kubelet $(BIN)/kube-proxy
# containerd 2.x for the real test node (its CRI plugin mounts image
# volumes, which Debian's 1.6 does not), with its runc shim and ctr.
CONTAINERD_VERSION := v2.2.9
CONTAINERD_BINS    := $(BIN)/containerd $(BIN)/containerd-shim-runc-v2 $(BIN)/ctr
TOOLS     := $(KUBE_BINS) $(CONTAINERD_BINS) $(BIN)/runc $(BIN)/netpol $(BIN)/etcd $(BIN)/kwok $(KWOK_DATA) $(BIN)/promtool

# The real test node (integration/cluster/node.go, docs/testing.md) runs
# pods with containerd (CONTAINERD_BINS) and runc (bin/runc: 1.2 or later
# runs pods in user namespaces, Debian 12's is 1.1.5), both built here,
# and the bridge CNI plugin from Debian's packages; runc is built with
# cgo against Debian's libseccomp. `make tools` installs the missing
# packages (as root; otherwise it says what to install). No registry is reachable, so every image its pods
# run is built here: NODE_IMAGES, with the step agent's (`make image`).
NODE_PACKAGES     := containernetworking-plugins busybox-static iproute2 iptables nftables gcc libc6-dev libseccomp-dev pkg-config patch
NODE_IMAGES       := $(BIN)/pause-image.tar $(BIN)/busybox-image.tar $(BIN)/registry-image-image.tar $(BIN)/mock-image.tar
PAUSE_IMAGE_REF   := jetway.test/pause:1
BUSYBOX_IMAGE_REF := jetway.test/busybox:1
REGISTRY_IMAGE_REF := jetway.test/registry-image:1
MOCK_IMAGE_REF    := jetway.test/mock-resource:1
# Concourse's mock resource type as testflight uses it (mock-resource
# v0.14.2 on busybox-static and bash-static, ../shared/concourse/testflight).
MOCK_ROOTFS       ?= $(CURDIR)/../shared/concourse/testflight/resource-types/mock/rootfs.tgz

# The Concourse web node the tests register targets with
# (integration/concourse, docs/testing.md): Concourse v8.2.5's concourse
# and fly, which no module proxy serves, from where CI has them unless
# given; and PostgreSQL from Debian's package, which `make tools`
# installs when missing (without Debian's default cluster: the tests make
# their own).
CONCOURSE_BIN       ?= $(CURDIR)/../shared/concourse/bin/concourse
FLY_BIN             ?= $(CURDIR)/../shared/concourse/bin/fly
CONCOURSE_PACKAGES  := postgresql
export JETWAY_CONCOURSE_BIN := $(CONCOURSE_BIN)
export JETWAY_FLY_BIN       := $(FLY_BIN)

# The stock Concourse worker the benchmarks compare jetway with
# (integration/concourse/stock.go, ../shared/concourse/STOCK-WORKER.md):
# `concourse worker --runtime containerd` with Debian's containerd 1.6,
# runc and CNI plugins, iptables and nft, and Concourse's container init,
# built static from CONCOURSE_INIT_SRC (Concourse v8.2.5's cmd/init/init.c)
# into bin/concourse-init; `make tools` installs the packages when missing.
CONCOURSE_INIT_SRC ?= $(CURDIR)/../shared/concourse/init.c
STOCK_PACKAGES     := containerd runc containernetworking-plugins busybox-static iptables nftables iproute2 gcc libc6-dev
export JETWAY_CONCOURSE_INIT := $(BIN)/concourse-init

# Clusters started by tests keep their files here, so that after the tests
# integration/leftovers.sh can prove no process of theirs is still running.
export JETWAY_CLUSTER_DIR := $(CURDIR)/.clusters
export JETWAY_BIN_DIR     := $(BIN)

.PHONY: testflight all build image node-images node-packages concourse-packages stock-packages concourse-bins tools test vet demo clean-tools kubelet-cluster

all: build

build:
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/gateway ./cmd/gateway

# image writes two `docker save`-style tarballs (docker load, ctr images
# import, kind load image-archive, crane push), built from Go modules alone,
# no Docker daemon and no base image:
#   bin/step-agent-image.tar  the image step pods copy the agent from;
#   bin/gateway-image.tar     the gateway: /gateway, `run` by default, no
#                             shell (the image the chart runs; its init
#                             container runs `/gateway mesh issue`).
# Both run as 65532:65532. The same commit gives the same digests.
image: $(BIN)/mkimage
	$(STATIC_BUILD) -o $(BIN)/step-agent-linux-$(IMAGE_ARCH) $(STEP_AGENT_PKG)
	$(MKIMAGE) -binary $(BIN)/step-agent-linux-$(IMAGE_ARCH) -path /step-agent \
		-ref $(IMAGE_REF) -title "jetway step-agent" \
		-description "jetway's step agent: copied into every step pod, and its volume sidecar" \
		-o $(BIN)/step-agent-image.tar
	$(STATIC_BUILD) -o $(BIN)/gateway-linux-$(IMAGE_ARCH) $(GATEWAY_PKG)
	$(MKIMAGE) -binary $(BIN)/gateway-linux-$(IMAGE_ARCH) -path /gateway -cmd run \
		-ref $(GATEWAY_IMAGE_REF) -title "jetway gateway" \
		-description "jetway: runs Concourse steps as pods on many Kubernetes clusters" \
		-o $(BIN)/gateway-image.tar

# node-images writes the images the real test node's pods run besides the
# step agent's: its sandbox (pause) image, a static Go program that reaps
# and waits, and a base image for tasks, Debian's busybox-static with a
# link for each of its commands (/bin/sh, /usr/bin/env, ...), run as root
# as many task images are, with /usr/bin/stamp (the time in nanoseconds,
# for the benchmarks) and a test resource type's scripts in /opt/resource;
# and the same busybox with a stand-in for Concourse's registry-image
# resource in /opt/resource (integration/testdata/registry-image), which
# reads the images the harness's registry serves, with the source's
# username and password when it has them; and Concourse's mock resource
# type, its rootfs as testflight ships it (MOCK_ROOTFS).
node-images: $(NODE_IMAGES)

$(BIN)/pause-image.tar: $(BIN)/mkimage integration/cmd/pause/main.go
	$(STATIC_BUILD) -o $(BIN)/pause-linux-$(IMAGE_ARCH) ./integration/cmd/pause
	$(MKIMAGE) -binary $(BIN)/pause-linux-$(IMAGE_ARCH) -path /pause -user 65535:65535 \
		-ref $(PAUSE_IMAGE_REF) -title "jetway test pause" -o $@

# RICH_ENTRIES: what real images hold and a volume must carry as it is: a
# root-only /root and key, /etc/shadow of group shadow (42), a setuid
# binary, a hard link, a user's 0750 home.
RICH_ENTRIES := -mkdir /root:0700:0:0 -write /root/.key:0600:0:0:root-only \
	-mkdir /etc:0755:0:0 -write /etc/shadow:0640:0:42:root:*:19000:0:99999:7::: \
	-write /usr/bin/suid-probe:4755:0:0:setuid -write /usr/bin/sgid-probe:2755:0:42:setgid \
	-mkdir /usr/share/hard:0755:0:0 -write /usr/share/hard/one:0644:0:0:linked -hardlink /usr/share/hard/two:/usr/share/hard/one \
	-mkdir /home/builder:0750:1000:1000 -write /home/builder/.key:0600:1000:1000:theirs

$(BIN)/busybox-image.tar: $(BIN)/mkimage integration/cmd/stamp/main.go $(wildcard integration/testdata/resource/*) | node-packages
	$(STATIC_BUILD) -o $(BIN)/stamp-linux-$(IMAGE_ARCH) ./integration/cmd/stamp
	$(MKIMAGE) -binary /bin/busybox -path /bin/busybox -user 0:0 -dir /tmp -cmd sh \
		-file $(BIN)/stamp-linux-$(IMAGE_ARCH):/usr/bin/stamp \
		$(foreach f,check in out,-file integration/testdata/resource/$(f):/opt/resource/$(f)) \
		$$(/bin/busybox --list-full | grep -vx bin/busybox | sed 's|^|-link /|') \
		$(RICH_ENTRIES) \
		-ref $(BUSYBOX_IMAGE_REF) -title "busybox (jetway's test base image)" -o $@

$(BIN)/registry-image-image.tar: $(BIN)/mkimage $(wildcard integration/testdata/registry-image/*) | node-packages
	$(MKIMAGE) -binary /bin/busybox -path /bin/busybox -user 0:0 -dir /tmp -cmd sh \
		$(foreach f,check in out registry.sh,-file integration/testdata/registry-image/$(f):/opt/resource/$(f)) \
		$$(/bin/busybox --list-full | grep -vx bin/busybox | sed 's|^|-link /|') \
		-ref $(REGISTRY_IMAGE_REF) -title "registry-image (jetway's test stand-in)" -o $@

$(BIN)/mock-image.tar: $(BIN)/mkimage $(MOCK_ROOTFS)
	$(MKIMAGE) -rootfs $(MOCK_ROOTFS) -user 0:0 \
		-ref $(MOCK_IMAGE_REF) -title "mock (Concourse's mock resource type, as testflight uses it)" -o $@

$(BIN)/mkimage: tools/mkimage/go.mod tools/mkimage/go.sum tools/mkimage/main.go
	cd tools/mkimage && $(GO) build -trimpath -o $@ .

vet:
	$(GO) vet ./...

# test runs every unit and integration test with the race detector, building
# the cluster tools first if they are missing and the images (their test
# reads them), checking Concourse's binaries are there, then fails if any
# control-plane process of the run is left behind. testreport prints what
# plain go test would, keeps every line in bin/test.log, and ends with the
# slowest tests and, when the suite times out, the tests still running.
test: tools concourse-bins vet image node-images
	rm -rf "$$JETWAY_CLUSTER_DIR"
	$(GO) build -o $(BIN)/testreport ./integration/cmd/testreport
	status=0; { $(GO) test -json -race -count=1 -timeout 75m ./... 2>&1 || echo "FAIL: go test exited $$?"; } \
		| $(BIN)/testreport -log $(BIN)/test.log || status=1; \
	bash integration/leftovers.sh || status=1; \
	rm -rf "$$JETWAY_CLUSTER_DIR"; exit $$status

# demo tells the story, printing each part as it goes: two local clusters
# and a target on each (.demo/targets), the gateway on 127.0.0.1:8080 (its
# log in .demo/gateway.log), the workers table, a step on cluster A whose
# output feeds a step on cluster B, and commands to try next; then it runs
# until Ctrl-C and removes everything (DEMO_FLAGS=--once stops after the
# story). The clusters pull no images: each step pod's process runs on this
# machine with bin/step-agent, so `make image` is not needed.
DEMO_FLAGS ?=
demo: build tools
	$(GO) build -o $(BIN)/step-agent ./cmd/step-agent
	$(GO) build -o $(BIN)/jetway-demo ./integration/cmd/jetway-demo
	$(BIN)/jetway-demo --gateway $(BIN)/gateway --step-agent $(BIN)/step-agent --dir .demo --listen 127.0.0.1:8080 $(DEMO_FLAGS)

# kubelet-cluster starts, for a person, the one-node cluster with a real
# kubelet the tests run real containers on (docs/testing.md): it prints the
# admin kubeconfig's path and how to stop it, and runs until Ctrl-C. As
# root; its folder is .kubelet-cluster, apart from the tests'.
kubelet-cluster: tools image node-images
	$(GO) build -o $(BIN)/kubelet-cluster ./integration/cmd/kubelet-cluster
	JETWAY_CLUSTER_DIR=$(CURDIR)/.kubelet-cluster $(BIN)/kubelet-cluster

# testflight runs Concourse v8.2.5's own integration suite against jetway
# (integration/cmd/testflight, docs/testing.md): the real node with one
# target, registered by bin/gateway as the only worker of testflight.sh's
# web node, with the mock resource type as bin/mock-image.tar. As root;
# long (docs/testing.md), so not part of `make test`. FOCUS and SKIP
# (ginkgo regexes; FOCUS=worker: the worker-side specs) pass through;
# results in TESTFLIGHT_DIR/out. That folder is outside the checkout:
# fly execute uploads of an input in a git work tree only what git tracks.
TESTFLIGHT_DIR ?= /tmp/jetway-testflight
testflight: tools concourse-bins build image node-images
	$(GO) build -o $(BIN)/testflight ./integration/cmd/testflight
	JETWAY_CLUSTER_DIR=$(TESTFLIGHT_DIR)/clusters $(BIN)/testflight -dir $(TESTFLIGHT_DIR)

# tools builds the pinned control-plane binaries the integration clusters
# run, and kubelet for the real test node, and installs the Debian
# packages the real node, the Concourse web node and the stock worker
# need when missing, and builds the stock worker's init. Each binary is
# rebuilt only when missing or when its pinning go.mod (or source)
# changes.
tools: $(TOOLS) node-packages concourse-packages stock-packages $(BIN)/concourse-init

# apt-install installs the Debian packages $(1) that are missing, as root;
# otherwise it says what to install, for $(2).
define apt-install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "$(2) needs Debian's$$missing: apt-get install$$missing (as root)"; exit 1; fi; \
		echo "installing$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

node-packages:
	$(call apt-install,$(NODE_PACKAGES),the real test node)

stock-packages:
	$(call apt-install,$(STOCK_PACKAGES),the stock Concourse worker)

$(BIN)/concourse-init: $(CONCOURSE_INIT_SRC) | stock-packages
	@mkdir -p $(BIN)
	gcc -O2 -static -o $@ $<

# concourse-packages installs PostgreSQL; Debian's package would make and
# start a cluster of its own on port 5432, which nothing here uses.
concourse-packages:
	@if [ "$$(id -u)" = 0 ] && ! dpkg -s $(CONCOURSE_PACKAGES) >/dev/null 2>&1; then \
		mkdir -p /etc/postgresql-common/createcluster.d && \
		echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/jetway.conf; \
	fi
	$(call apt-install,$(CONCOURSE_PACKAGES),the Concourse web node of the tests)

# concourse-bins fails, naming the variables, when Concourse's binaries
# are not where CONCOURSE_BIN and FLY_BIN say.
concourse-bins:
	@status=0; for v in "CONCOURSE_BIN concourse $(CONCOURSE_BIN)" "FLY_BIN fly $(FLY_BIN)"; do \
		set -- $$v; if [ ! -x "$$3" ]; then status=1; \
			echo "Concourse v8.2.5's $$2 is not at $$3: set $$1 (make $$1=/path/to/$$2 test)"; fi; \
	done; exit $$status

$(KUBE_BINS) &: tools/kube/go.mod tools/kube/go.sum
	cd tools/kube && $(GO) build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $(BIN)/ \
		k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-scheduler \
		k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kubelet \
		k8s.io/kubernetes/cmd/kube-proxy
	touch $(KUBE_BINS)

# containerd without cgo, as its static release is, and without the
# snapshotters the node disables (btrfs, devmapper, zfs).
$(CONTAINERD_BINS) &: tools/containerd/go.mod tools/containerd/go.sum
	cd tools/containerd && CGO_ENABLED=0 $(GO) build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
		-ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)" -o $(BIN)/ \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr
	touch $(CONTAINERD_BINS)

# runc with its seccomp filter (cgo, libseccomp), as its releases are.
$(BIN)/runc: tools/runc/go.mod tools/runc/go.sum | node-packages
	cd tools/runc && CGO_ENABLED=1 $(GO) build -trimpath -tags seccomp -ldflags "-s -w" -o $@ github.com/opencontainers/runc
	touch $@

# The real node's NetworkPolicy enforcer: kube-network-policies, run by
# the node as a process (tools/netpol/main.go), with two files patched
# (xtqueue.patch: its rules queue packets through iptables' NFQUEUE
# target, as this machine's kernel has no nftables queue expression; and
# nri.patch: without NRI, a packet to an address no pod has no longer
# crashes it): a
# patched copy of the module, which a copy of tools/netpol's go.mod
# replaces it with (-modfile); tools/netpol itself names the release.
$(BIN)/netpol: tools/netpol/go.mod tools/netpol/go.sum tools/netpol/main.go tools/netpol/xtqueue.patch tools/netpol/nri.patch | node-packages
	rm -rf $(BIN)/netpol-src && mkdir -p $(BIN)/netpol-src
	cd tools/netpol && $(GO) mod download sigs.k8s.io/kube-network-policies && \
		cp -r $$($(GO) list -m -f '{{.Dir}}' sigs.k8s.io/kube-network-policies) $(BIN)/netpol-src/module && \
		chmod -R u+w $(BIN)/netpol-src/module && \
		patch -s -p1 -d $(BIN)/netpol-src/module/pkg/networkpolicy < xtqueue.patch && \
		patch -s -p1 -d $(BIN)/netpol-src/module/pkg/networkpolicy < nri.patch && \
		cp go.mod go.sum $(BIN)/netpol-src/ && \
		$(GO) mod edit -modfile=$(BIN)/netpol-src/go.mod -replace sigs.k8s.io/kube-network-policies=$(BIN)/netpol-src/module && \
		$(GO) build -modfile=$(BIN)/netpol-src/go.mod -trimpath -ldflags "-s -w" -o $@ .

# kubectl is for the streams benchmark's reference path, and for people
# (`make kubectl`; docs/testing.md).
.PHONY: kubectl
kubectl: $(BIN)/kubectl
$(BIN)/kubectl: tools/kube/go.mod tools/kube/go.sum
	cd tools/kube && $(GO) build -trimpath -ldflags "$(KUBE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubectl

$(BIN)/etcd: tools/etcd/go.mod tools/etcd/go.sum
	cd tools/etcd && $(GO) build -trimpath -ldflags "-s -w" -o $@ go.etcd.io/etcd/server/v3

# promtool evaluates the Helm chart's alert rules (deploy/helm TestAlertRules).
$(BIN)/promtool: tools/promtool/go.mod tools/promtool/go.sum
	cd tools/promtool && $(GO) build -trimpath -ldflags "-s -w" -o $@ github.com/prometheus/prometheus/cmd/promtool

$(BIN)/kwok: tools/kwok/go.mod tools/kwok/go.sum
	cd tools/kwok && $(GO) build -trimpath -ldflags "-s -w" -o $@ sigs.k8s.io/kwok/cmd/kwok

# kwok-data holds the pinned kwok's own stage and CRD manifests
# (KWOK_DATA_FILES), which the integration clusters load.
$(KWOK_DATA) &: $(BIN)/kwok
	rm -rf $(BIN)/kwok-data && mkdir -p $(BIN)/kwok-data
	src=$$(cd tools/kwok && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/kwok) && \
	cp $(addprefix $$src/,$(KWOK_DATA_FILES)) $(BIN)/kwok-data/ && \
	chmod u+w $(BIN)/kwok-data/*

clean-tools:
	rm -rf $(TOOLS) $(BIN)/netpol-src $(BIN)/kwok-data $(BIN)/mkimage $(NODE_IMAGES) $(BIN)/concourse-init

# bench-targets: a real gateway over 1,000 targets on 3 local clusters at a
# 10 s health interval for 2 minutes (BENCH_TARGETS / BENCH_DURATION shrink it).
.PHONY: bench-targets
bench-targets: tools
	$(GO) test -run '^$$' -bench '^BenchmarkTargets$$' -benchtime 1x -timeout 30m -v ./integration/bench/
	$(GO) test -run '^$$' -bench '^BenchmarkCheckPaths$$' -benchtime 300x -timeout 10m -v ./integration/bench/

# bench-streams: one artifact (1 GiB; BENCH_STREAM_MIB shrinks it) from a pod
# on cluster A into a pod on cluster B: the client-go floor, jetway's relay
# and kubectl + curl, in one run; then the sidecar's token check against
# the same stream-out without it, alternately in one run. Needs curl.
.PHONY: bench-streams
bench-streams: tools $(BIN)/kubectl
	@command -v curl >/dev/null || { echo "bench-streams needs curl (apt-get install curl)"; exit 1; }
	$(GO) test -run '^$$' -bench '^BenchmarkStreams$$' -benchtime 1x -timeout 30m -v ./integration/bench/
	$(GO) test -run '^$$' -bench '^BenchmarkAuthorization$$' -benchtime 2s -count 6 ./volumes/

# bench-concourse: 100 targets (BENCH_CONCOURSE_TARGETS) registered with a
# real web node by a real gateway: time until all run in fly workers, the
# gateway's CPU and RSS per target, and the web node's CPU for them against
# as many idle stock-shaped registrations (BENCH_CONCOURSE_STEADY each);
# the sweep of 1,000 containers, their records listed and watched; and (as
# root: the real node) the API requests per minute of one target, idle,
# with 50 check containers and with 10 running builds too; and a 1 GiB
# artifact (BENCH_P2P_MIB) from one task to the next on a stock worker,
# between two jetway targets of one local cluster and of two, and relayed
# by a web node without p2p (BenchmarkConcourseP2P, docs/concourse.md).
.PHONY: bench-concourse
bench-concourse: tools concourse-bins
	$(GO) test -run '^$$' -bench '^BenchmarkConcourse(Registration|Sweep|APIRequests|P2P)$$' -benchtime 1x -timeout 90m -v ./integration/bench/

# bench-pipeline: one pipeline of five steps (get, two tasks with an input
# and an output, a cached task, a put) on the real node, through a real web
# node on a jetway worker and through jetway's own step API, alternating
# build by build (BENCH_PIPELINE_BUILDS each, after one to warm up): time
# per build and per step, their ratio, and the volume copies and moves a
# build made. Then a task writing an N-byte artifact read by the next
# (BENCH_ARTIFACT_MIB, default 16,1024), through one web node on a stock
# Concourse containerd worker and on a jetway target on the real node,
# alternating (BENCH_ARTIFACT_BUILDS each, default 5,3): build times, their
# ratio, jetway's bytes moved per build and its transfer rate against the
# node's own cp. Then a task whose image is a rootfs the task before it
# built (BENCH_IMAGE_MIB, default 200, of data past busybox's files), first
# use and reuse, on the same two workers (BENCH_IMAGE_BUILDS each, default
# 3). As root (the real node, the stock worker).
.PHONY: bench-pipeline
bench-pipeline: tools concourse-bins image node-images
	$(GO) test -run '^$$' -bench '^BenchmarkConcoursePipeline$$' -benchtime 1x -timeout 40m -v ./integration/bench/
	$(GO) test -run '^$$' -bench '^BenchmarkConcourseArtifacts$$' -benchtime 1x -timeout 60m -v ./integration/bench/
	$(GO) test -run '^$$' -bench '^BenchmarkConcourseBuiltImage$$' -benchtime 1x -timeout 40m -v ./integration/bench/

# bench-agent: one artifact (1 GiB; BENCH_AGENT_MIB shrinks it) from a
# pod on a local cluster into a task on a `gateway agent` process through a
# real gateway's mesh, against the floor: the same bytes from the same pod
# over one plain TLS 1.3 connection with the mesh's certificates into a
# receiver that writes them as the agent does; alternating, each path
# BENCH_AGENT_ROUNDS (default 2) times, in one run.
.PHONY: bench-agent
bench-agent: tools
	$(GO) test -run '^$$' -bench '^BenchmarkAgent$$' -benchtime 1x -timeout 30m -v ./integration/bench/

# bench-placement: one placement decision over 1,000 and 10,000 targets with
# the default chain and with fewest-build-containers,limit-active-tasks:
# jetway's fast path against a full shuffle-and-sort reference, in one run.
.PHONY: bench-placement
bench-placement:
	$(GO) test -run '^$$' -bench Place -benchmem ./selection/

# bench-steps: 100 short tasks (BENCH_STEPS changes it) on a local cluster,
# jetway against the floor a bare client-go program reaches (create a pod,
# wait for Running, exec), alternating, in one run: p50/p99 from submit to
# process start and from process exit to the exited event (on the real
# node two gateways, the agent as an image volume and with the init
# container, each against the floor; JETWAY_KUBELET_V=4 logs kubelet's
# timeline of each pod); then 100 checks
# of one resource, a fresh pod each against a warm sandbox: p50/p99 from
# call to answer; then the same 100 tasks, 10 at once, through one gateway
# and through two replicas sharing the target and the state namespace,
# alternating (BENCH_ROUNDS, default 2): throughput and start p50 ratios.
.PHONY: bench-steps
bench-steps: tools
	$(GO) test -run '^$$' -bench '^Benchmark(Steps|CheckSandboxes|StepsReplicas)$$' -benchtime 1x -timeout 45m -v ./integration/bench/

# bench-output: one task printing 1 GiB (BENCH_OUTPUT_MIB changes it)
# followed to its end: the gateway's RSS growth while it runs and after,
# then, after a restart, while the new gateway serves its events from 0.
.PHONY: bench-output
bench-output: tools
	$(GO) test -run '^$$' -bench '^BenchmarkStepOutput$$' -benchtime 1x -timeout 30m -v ./integration/bench/

# bench-mesh: real mesh members against plain TLS 1.3 connections with the
# same certificates, at RTT 0 and 40 ms through a delay proxy, in one run:
# one 1 GiB stream, 8 streams of 1 GiB in all, and an API call's p50/p99
# beside 4 volume streams (MESH_BENCH_BYTES, MESH_BENCH_ROUNDS and
# MESH_BENCH_INFLIGHT change it; mesh/bench_test.go).
.PHONY: bench-mesh
bench-mesh:
	$(GO) test -run '^$$' -bench '^BenchmarkMesh$$' -benchtime 1x -timeout 30m ./mesh/
