# cocoon: a containerd runtime that restores microVMs from snapshots.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
GUEST := $(CURDIR)/build/guest
CMDS := $(notdir $(wildcard cmd/*))
GOTEST_FLAGS ?= -count=1 -timeout 20m

# Test tools built at pinned versions by `go install pkg@version`, each in its own
# module graph: cri-tools drags kubectl, kubelet and ginkgo into a go.mod that
# lists it as a tool, and the CNI plugins v1.10.0 would raise go.mod's go
# version and containerd's own dependencies. CNI plugins go to bin/cni, the
# CRI plugin's bin_dirs and cnitest's.
CRI_TOOLS_VERSION := v1.37.0
CRANE_VERSION := v0.22.1
CNI_PLUGINS_VERSION := v1.10.0
CNI_PLUGINS := main/bridge ipam/host-local main/loopback

# runc for the guest, which runs each container of a pod's VM with it (issues
# 21/22): built from the module proxy at a pinned version in its own module
# graph, with seccomp (cgo against Debian's libseccomp.a) and linked static,
# since the guest has no C library. The netgo and osusergo tags keep glibc's
# NSS, which cannot link static, out of it.
RUNC_VERSION := v1.5.3

.PHONY: all build containerd tools runc-guest deps guest critest test unit lint generate clean demo bench fuzz soak

all: build

## build: every binary into bin/ (the guest agent and the shim's launcher and server static: they
## start on every task's path, and a static binary skips the dynamic loader), plus containerd, ctr
## and the test tools
build: containerd tools
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(filter-out cocoon-agent cocoon-cinit cocoon-pause containerd-shim-cocoon-v2 cocoon-shim-server,$(CMDS)))
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/containerd-shim-cocoon-v2 ./cmd/cocoon-shim-server
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/cocoon-agent ./cmd/cocoon-agent
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/cocoon-cinit ./cmd/cocoon-cinit
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/cocoon-pause ./cmd/cocoon-pause

## containerd: containerd v2.4.2, ctr and containerd-shim-runc-v2, pinned as go.mod tools
containerd:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2

## tools: crictl, critest (a ginkgo test binary, built with go test -c in cri-tools' own module
## dir), crane (its registry serves critest's images) and the CNI plugins bridge, host-local and
## loopback (bin/cni) for the CRI tier
tools:
	@mkdir -p $(BIN)/cni
	GOBIN=$(BIN) $(GO) install -ldflags '-X sigs.k8s.io/cri-tools/pkg/version.Version=$(CRI_TOOLS_VERSION)' \
		sigs.k8s.io/cri-tools/cmd/crictl@$(CRI_TOOLS_VERSION)
	cd "$$($(GO) mod download -json sigs.k8s.io/cri-tools@$(CRI_TOOLS_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')" && \
		$(GO) test -c -ldflags '-X sigs.k8s.io/cri-tools/pkg/version.Version=$(CRI_TOOLS_VERSION)' -o $(BIN)/critest ./cmd/critest
	GOBIN=$(BIN) $(GO) install github.com/google/go-containerregistry/cmd/crane@$(CRANE_VERSION)
	GOBIN=$(BIN)/cni $(GO) install -ldflags '-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$(CNI_PLUGINS_VERSION)' \
		$(addprefix github.com/containernetworking/plugins/plugins/,$(addsuffix @$(CNI_PLUGINS_VERSION),$(CNI_PLUGINS)))

## runc-guest: bin/guest/runc, the static runc (with seccomp) the guest's initramfs carries
runc-guest: deps
	@mkdir -p $(BIN)/guest
	CGO_ENABLED=1 GOBIN=$(BIN)/guest $(GO) install -trimpath -tags 'seccomp netgo osusergo' \
		-ldflags '-s -w -extldflags -static -X main.version=$(RUNC_VERSION:v%=%)' \
		github.com/opencontainers/runc@$(RUNC_VERSION)

## deps: the Debian packages the guest build and the tests need
deps:
	scripts/install-deps.sh

## guest: build/guest/{vmlinuz,initramfs.cpio.gz,BUILDINFO}
guest: deps build runc-guest
	guest/build.sh $(GUEST)

## demo: run a container through cocoon (mmap, then copy restore) in a private containerd;
## the snapshot image is baked once into build/snapshots. KEEP=1 leaves the daemons running.
demo: deps build guest
	$(BIN)/cocoon-bench demo $(if $(KEEP),--keep)

## bench: N=1,8,16 containers at once: cocoon restores (copy, mmap; direct and through
## containerd), runc and a cold boot side by side, plus a network namespace and an ordinary
## image (N=1,8) and first-use image conversions, into bench/results/<date>.{json,md,svg}
## and the README's benchmark section (cocoon-bench bench -h lists the flags)
bench: deps build guest
	$(BIN)/cocoon-bench bench --readme README.md

## soak: 1000 restores through containerd, 8 at a time, mixed copy/mmap, with the task,
## the shim or QEMU killed in 10 %; fails if a restore failed or any count did not come back
soak: deps build guest
	$(BIN)/cocoon-bench soak

## critest: the whole of critest v1.37.0 (cri-tools' CRI validation suite) with the runc and the
## cocoon handler at once, side by side into bench/results/critest-<date>.md; fails when a spec
## runc passes fails with cocoon and cri/critest/allowed.txt lacks it, or lists a spec cocoon
## passes (make test runs the same comparison without writing the result)
critest: deps build guest
	$(GO) test -count=1 -v -timeout 30m -run '^TestCritest$$' ./cri/critest/ \
		-args -critest.out $(CURDIR)/bench/results/critest-$$(date -u +%F).md

## test: install what the tests need, then run every tier; shim/share once more built as the
## shim server is, without cgo (its helper drops its capabilities only so)
test: deps build guest lint
	$(GO) test $(GOTEST_FLAGS) ./...
	CGO_ENABLED=0 $(GO) test $(GOTEST_FLAGS) ./shim/share/

## fuzz: every native fuzz target in the repo for FUZZTIME each (`make test` runs their
## seed corpora only); FUZZMINIMIZETIME bounds minimizing each new input
FUZZTIME ?= 30s
FUZZMINIMIZETIME ?= 100x
fuzz:
	@set -e; for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for target in $$($(GO) test -list '^Fuzz' $$dir | grep '^Fuzz'); do \
			echo "== $$dir $$target ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) $$dir; \
		done; \
	done

## unit: the unit tier alone (go test -short: pure logic, no root, QEMU or
## containerd; the tests that need them say UNIT TIER and skip)
unit:
	$(GO) test -short -count=1 ./...

## lint: gofmt, go vet, staticcheck
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: $$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

clean:
	rm -rf $(BIN) build

## generate: regenerate protobuf/ttrpc code (protoc from Debian, plugins from the module proxy)
generate: deps
	$(GO) generate ./agent/...
