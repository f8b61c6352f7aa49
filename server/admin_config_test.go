package server

import (
	"errors"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeConfig is a Config over a map: requirepass and maxclients change at
// run time (applied to srv), port needs a restart.
type fakeConfig struct {
	mu       sync.Mutex
	srv      *Server
	values   map[string]string
	rewrites int
	noFile   bool
}

var _ Config = (*fakeConfig)(nil)

func (f *fakeConfig) Get(glob string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, name := range []string{"maxclients", "port", "requirepass"} {
		if ok, _ := path.Match(glob, name); ok {
			out = append(out, name, f.values[name])
		}
	}
	return out
}

func (f *fakeConfig) Set(name, value string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch name {
	case "requirepass":
		f.srv.SetRequirePass(value)
	case "maxclients":
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 {
			return errors.New("want a number of clients")
		}
		f.srv.SetMaxClients(n)
	case "port":
		return ErrConfigRestart
	default:
		return ErrConfigUnknown
	}
	f.values[name] = value
	return nil
}

func (f *fakeConfig) Rewrite() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noFile {
		return ErrNoConfigFile
	}
	f.rewrites++
	return nil
}

func TestConfigCommand(t *testing.T) {
	fake := &fakeConfig{values: map[string]string{"maxclients": "10000", "port": "7711", "requirepass": ""}}
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{Config: fake})
	fake.mu.Lock()
	fake.srv = s
	fake.mu.Unlock()
	s.SetBroker(newBroker(t))
	rc := dialResp(t, addr)
	for _, tc := range []struct{ cmd, want string }{
		{"CONFIG GET maxclients", "*[$maxclients $10000]"},
		{"CONFIG GET MAX*", "*[$maxclients $10000]"},
		{"CONFIG GET *", "*[$maxclients $10000 $port $7711 $requirepass $]"},
		{"CONFIG GET nothing", "*[]"},
		{"CONFIG SET maxclients 5", "+OK"},
		{"CONFIG GET maxclients", "*[$maxclients $5]"},
		{"CONFIG SET maxclients zero", "-ERR CONFIG SET failed (possibly related to argument 'maxclients') - want a number of clients"},
		{"CONFIG SET port 1", "-ERR CONFIG SET of 'port' needs a restart"},
		{"CONFIG SET bogus 1", "-ERR Unknown option or number of arguments for CONFIG SET - 'bogus'"},
		{"CONFIG SET maxclients", "-ERR wrong number of arguments for 'config|set' command"},
		{"CONFIG FOO", "-ERR unknown CONFIG subcommand 'FOO'"},
		{"CONFIG REWRITE", "+OK"},
	} {
		if got := rc.do(tc.cmd); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.cmd, got, tc.want)
		}
	}
	if fake.rewrites != 1 {
		t.Errorf("rewrites = %d, want 1", fake.rewrites)
	}
	fake.noFile = true
	if got := rc.do("CONFIG REWRITE"); got != "-ERR The server is running without a config file" {
		t.Errorf("REWRITE without a file = %q", got)
	}

	// requirepass set at run time: new connections need AUTH, this one
	// (which never authenticated) too; clearing it lets them in again.
	if got := rc.do("CONFIG SET requirepass s3cret"); got != "+OK" {
		t.Fatalf("SET requirepass = %q", got)
	}
	other := dialResp(t, addr)
	if got := other.do("QLEN q"); got != "-"+errNoAuth {
		t.Fatalf("new connection without AUTH = %q", got)
	}
	if got := other.do("AUTH s3cret"); got != "+OK" {
		t.Fatalf("AUTH = %q", got)
	}
	if got := other.do("CONFIG SET requirepass \"\""); got != "+OK" {
		t.Fatalf("clear requirepass = %q", got)
	}
	if got := dialResp(t, addr).do("QLEN q"); got != ":0" {
		t.Fatalf("after clearing requirepass = %q", got)
	}

	// maxclients lowered at run time refuses the connections beyond it.
	if got := rc.do("CONFIG SET maxclients 3"); got != "+OK" {
		t.Fatal(got)
	}
	if got := dialResp(t, addr).read(); got != "-"+errMaxClients {
		t.Fatalf("connection over maxclients = %q", got)
	}
}

func TestConfigWithoutConfig(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	rc := dialResp(t, addr)
	if got := rc.do("CONFIG GET *"); got != "*[]" {
		t.Errorf("GET = %q", got)
	}
	if got := rc.do("CONFIG SET maxclients 1"); !strings.HasPrefix(got, "-ERR Unknown option") {
		t.Errorf("SET = %q", got)
	}
	if got := rc.do("CONFIG REWRITE"); got != "-ERR The server is running without a config file" {
		t.Errorf("REWRITE = %q", got)
	}
}

func TestConfigResetStat(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	rc := dialResp(t, addr)
	for range 5 {
		rc.do("PING")
	}
	stat := func(name string) int {
		m := regexp.MustCompile(name + `:(\d+)`).FindStringSubmatch(rc.do("INFO stats"))
		if m == nil {
			t.Fatalf("no %s in INFO", name)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if n := stat("total_commands_processed"); n < 6 {
		t.Fatalf("total_commands_processed = %d before RESETSTAT", n)
	}
	if got := rc.do("CONFIG RESETSTAT"); got != "+OK" {
		t.Fatal(got)
	}
	// RESETSTAT itself is counted before it resets; INFO counts itself.
	if n := stat("total_commands_processed"); n != 1 {
		t.Errorf("total_commands_processed after RESETSTAT = %d, want 1", n)
	}
	if n := stat("total_connections_received"); n != 0 {
		t.Errorf("total_connections_received after RESETSTAT = %d, want 0", n)
	}
}

func TestSlowlog(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	s.SetSlowlog(50*time.Millisecond, 2)
	rc := dialResp(t, addr)
	rc.do("CLIENT SETNAME sleeper")
	if got := rc.do("DEBUG SLEEP 0.1"); got != "+OK" {
		t.Fatal(got)
	}
	rc.do("PING") // fast: not logged
	if got := rc.do("SLOWLOG LEN"); got != ":1" {
		t.Fatalf("SLOWLOG LEN = %q", got)
	}
	local := rc.c.LocalAddr().String()
	got := rc.do("SLOWLOG GET")
	re := regexp.MustCompile(`^\*\[\*\[:0 :(\d+) :(\d+) \*\[\$DEBUG \$SLEEP \$0\.1\] \$` + regexp.QuoteMeta(local) + ` \$sleeper\]\]$`)
	m := re.FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("SLOWLOG GET = %q", got)
	}
	if at, _ := strconv.ParseInt(m[1], 10, 64); time.Since(time.Unix(at, 0)) > time.Minute {
		t.Errorf("entry time %s is not now", m[1])
	}
	if us, _ := strconv.ParseInt(m[2], 10, 64); us < 100000 {
		t.Errorf("duration %dµs, want at least 100000", us)
	}

	// Long arguments are cut; max-len keeps the newest entries.
	long := strings.Repeat("x", 200)
	if got := rc.do("DEBUG SLEEP 0.06 " + long); !strings.HasPrefix(got, "-ERR wrong number") {
		t.Fatal(got)
	}
	s.SetSlowlog(0, 2) // log everything
	rc.do("PING " + long)
	got = rc.do("SLOWLOG GET 1")
	if !strings.Contains(got, "$PING $"+strings.Repeat("x", 128)+"... (72 more bytes)]") {
		t.Errorf("long argument not truncated: %q", got)
	}
	if got := rc.do("SLOWLOG LEN"); got != ":2" {
		t.Errorf("SLOWLOG LEN with max-len 2 = %q", got)
	}
	if got := rc.do("SLOWLOG GET -1"); strings.Count(got, "*[:") != 2 {
		t.Errorf("SLOWLOG GET -1 = %q", got)
	}
	s.SetSlowlog(-1, 2) // off
	if got := rc.do("SLOWLOG RESET"); got != "+OK" {
		t.Fatal(got)
	}
	rc.do("DEBUG SLEEP 0.06")
	if got := rc.do("SLOWLOG LEN"); got != ":0" {
		t.Errorf("SLOWLOG LEN after RESET with the log off = %q", got)
	}
	if got := rc.do("SLOWLOG GET x"); got != "-ERR count should be greater than or equal to -1" {
		t.Errorf("SLOWLOG GET x = %q", got)
	}
}

func TestSlowlogSkipsBlockedGetJob(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	s.SetSlowlog(0, 10)
	rc := dialResp(t, addr)
	if got := rc.do("GETJOB TIMEOUT 50 FROM q"); got != "*-1" {
		t.Fatalf("GETJOB = %q", got)
	}
	if got := rc.do("SLOWLOG GET"); got != "*[]" {
		t.Errorf("blocking GETJOB logged: %q", got)
	}
}

func TestInfoStorage(t *testing.T) {
	s, addr := startServer(t)
	rc := dialResp(t, addr)
	if got := rc.do("INFO"); strings.Contains(got, "# Storage") {
		t.Errorf("Storage section while loading: %q", got)
	}
	s.SetBroker(newBroker(t))
	for range 3 {
		if got := rc.do("ADDJOB q " + strings.Repeat("b", 100) + " 0"); !strings.HasPrefix(got, "+D-") {
			t.Fatal(got)
		}
	}
	all := rc.do("INFO")
	// Storage between Stats and CPU: CPU, Disque's last section, stays last
	// (disqueue-node drops the last line of the last section).
	stats, storage, cpu := strings.Index(all, "# Stats"), strings.Index(all, "# Storage"), strings.Index(all, "# CPU")
	if stats < 0 || storage < stats || cpu < storage {
		t.Fatalf("sections not in the order Stats, Storage, CPU: %q", all)
	}
	if !regexp.MustCompile(`\r\nused_cpu_user_children:\d+\.\d\d\r\n$`).MatchString(all) {
		t.Errorf("INFO does not end with used_cpu_user_children: %q", all[max(len(all)-80, 0):])
	}
	got := strings.TrimPrefix(rc.do("INFO storage"), "$")
	if strings.Count(got, "#") != 1 {
		t.Errorf("'#' in a value: %q", got)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(got), "\r\n")[1:] {
		k, v, _ := strings.Cut(line, ":")
		fields[k] = v
	}
	for _, k := range []string{"segments", "aof_bytes", "live_bodies", "live_bytes", "applied_lsn", "index_size", "index_l0_files",
		"index_flushes", "index_flushed_bytes", "index_compactions", "index_compacted_bytes", "index_compaction_read_bytes",
		"memtable_bytes", "index_write_buffer_bytes", "index_write_buffer_flushes", "index_write_stalls", "index_write_stall_ms"} {
		if _, err := strconv.ParseInt(fields[k], 10, 64); err != nil {
			t.Errorf("%s = %q, want an integer", k, fields[k])
		}
	}
	if fields["live_bodies"] != "3" || fields["segments"] == "0" || fields["applied_lsn"] == "0" {
		t.Errorf("storage fields: %v", fields)
	}
	for _, k := range []string{"live_ratio", "block_cache_hit_rate"} {
		if !regexp.MustCompile(`^\d\.\d{3}$`).MatchString(fields[k]) {
			t.Errorf("%s = %q, want %%.3f", k, fields[k])
		}
	}
}
