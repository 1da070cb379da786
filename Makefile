# cocoon: a containerd runtime that restores microVMs from snapshots.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
GUEST := $(CURDIR)/build/guest
CMDS := $(notdir $(wildcard cmd/*))
GOTEST_FLAGS ?= -count=1 -timeout 20m

.PHONY: all build containerd deps guest test lint generate clean demo bench fuzz

all: build

## build: every binary into bin/ (the guest agent static), plus containerd and ctr
build: containerd
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(filter-out cocoon-agent,$(CMDS)))
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(BIN)/cocoon-agent ./cmd/cocoon-agent

## containerd: containerd v2.4.2 and ctr, pinned as go.mod tools
containerd:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr

## deps: the Debian packages the guest build and the tests need
deps:
	scripts/install-deps.sh

## guest: build/guest/{vmlinuz,initramfs.cpio.gz,BUILDINFO}
guest: deps build
	guest/build.sh $(GUEST)

## demo: run a container through cocoon (mmap, then copy restore) in a private containerd;
## the snapshot image is baked once into build/snapshots. KEEP=1 leaves the daemons running.
demo: deps build guest
	$(BIN)/cocoonctl demo $(if $(KEEP),--keep)

## bench: fan-out restores (N=1,8,16; copy, mmap; direct and through containerd) into
## bench/results/<date>.{json,md,svg} and the README's benchmark section
bench: deps build guest
	$(BIN)/cocoonctl bench --readme README.md

## test: install what the tests need, then run every tier
test: deps build guest lint
	$(GO) test $(GOTEST_FLAGS) ./...

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
