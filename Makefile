# diskque — the commands a user and CI need. `make test` is what CI runs.
GO       ?= go
PKGS     ?= ./...
BIN      := bin
# -p 2 matches the 2-core machines we build on; -race needs cgo.
TESTFLAGS ?= -race -count=1 -timeout 15m

.PHONY: all build run cluster test bench gobench lint fmt fuzz clean disque-suite

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# run starts the server on the embedded defaults: data in ./data, 127.0.0.1:7711.
run: build
	$(BIN)/diskque-server --dir ./data --bind 127.0.0.1 --port 7711

# cluster starts 3 local nodes (127.0.0.1:7711-7713, data in ./data/cluster/N) and MEETs them.
cluster: build
	bench/scripts/cluster.sh $(BIN)/diskque-server

test: lint
	$(GO) test $(TESTFLAGS) $(PKGS)

# bench runs a short load-generator matrix (diskque in each persistence mode,
# produce and consume at pipeline 1 and 16) and writes bench/results/:
# matrix.md (table), matrix.json (one line per run), matrix.svg and
# matrix-p99.svg (charts). See bench/README.md.
BENCHFLAGS ?= --clients 20 --count 20000
bench: build
	mkdir -p bench/results
	rm -f bench/results/matrix.json
	$(BIN)/diskque-bench --matrix --modes appendonly-no,fsync-no,everysec,always $(BENCHFLAGS) \
		--server $(BIN)/diskque-server --json bench/results/matrix.json \
		--chart bench/results/matrix.svg --chart-p99 bench/results/matrix-p99.svg > bench/results/matrix.md.tmp
	mv bench/results/matrix.md.tmp bench/results/matrix.md

# disque-suite runs Disque 1.0's own cluster test suite against bin/diskque-server
# (README "Developing"): DISQUE_TESTS is a copy of the suite,
# DISQUE_UNITS a glob of units (default all). Not part of `make test`: CI has no
# copy of the suite.
DISQUE_TESTS ?=
DISQUE_UNITS ?=
disque-suite: build
	@[ -n "$(DISQUE_TESTS)" ] || { echo "set DISQUE_TESTS=dir (a copy of Disque's tests/, see README)"; exit 2; }
	testdata/disque-suite/run.sh $(DISQUE_TESTS) $(BIN)/diskque-server $(DISQUE_UNITS)

# gobench runs the Go micro-benchmarks (wal, storage, ...).
gobench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# fuzz runs each fuzz target for FUZZTIME (the seed corpora already run in `make test`).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./wal -run '^$$' -fuzz '^FuzzDecodeFrame$$' -fuzztime $(FUZZTIME)
	$(GO) test ./wal -run '^$$' -fuzz '^FuzzPlanTail$$' -fuzztime $(FUZZTIME)
	$(GO) test ./storage -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $(FUZZTIME)
	$(GO) test ./storage -run '^$$' -fuzz '^FuzzDecodeJob$$' -fuzztime $(FUZZTIME)

clean:
	rm -rf $(BIN)
