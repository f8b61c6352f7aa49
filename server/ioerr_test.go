package server

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/diskque/diskque/storage"
	"github.com/redis/go-redis/v9"
)

// persistence returns INFO persistence as key: value.
func persistence(t *testing.T, c *redis.Client) map[string]string {
	t.Helper()
	info, err := c.Info(context.Background(), "persistence").Result()
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string]string{}
	for _, line := range strings.Split(info, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			kv[k] = v
		}
	}
	return kv
}

// A disk that fails under the store: the clients' -IOERR is one short,
// stable text, without the error chain and the paths (the log has them,
// once), and INFO persistence says that writes fail (Disque's
// aof_last_write_status:err) instead of aof_state:on.
func TestFailedStoreRepliesAndInfo(t *testing.T) {
	dir := t.TempDir()
	var failing atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failing.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	}))
	var logs lockedBuffer
	opts := storage.TestingOptions()
	opts.FS = fs
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b := runBroker(t, dir, opts)
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{
		Info:   InfoSource{AOFEnabled: true, AppendFsync: "always"},
		Logger: opts.Logger,
	})
	s.SetBroker(b)
	c := newClientOn(t, addr)

	id := addJob(t, c, "q")
	if p := persistence(t, c); p["aof_state"] != "on" || p["aof_last_write_status"] != "ok" {
		t.Fatalf("INFO persistence of a healthy store: %v", p)
	}
	failing.Store(true)
	const want = "IOERR the store failed (a disk error); writes are refused until the disk works again"
	for range 3 {
		if got := doErr(t, c, "ADDJOB", "q", "body", 0); got != want {
			t.Fatalf("ADDJOB on a full disk: %q, want %q", got, want)
		}
	}
	if got := doErr(t, c, "ACKJOB", id); got != want {
		t.Fatalf("ACKJOB on a failed store: %q, want %q", got, want)
	}
	if _, err := c.Do(context.Background(), "SHOW", id).Result(); err != nil {
		t.Fatalf("SHOW on a failed store: %v", err) // reads go on
	}
	p := persistence(t, c)
	if p["aof_state"] != "failed" || p["aof_last_write_status"] != "err" || p["aof_enabled"] != "1" {
		t.Fatalf("INFO persistence of a failed store: %v", p)
	}
	// The detail is in the log, once.
	log := logs.String()
	if n := strings.Count(log, "the store failed"); n != 1 ||
		!strings.Contains(log, dir) || !strings.Contains(log, "no space left on device") {
		t.Fatalf("%d lines about the failure; log:\n%s", n, log)
	}
}
