package clustertest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

// TestCLI drives the cortado binary's client commands against a server and
// checks what they print.
func TestCLI(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo"}})
	jsonOf := func(s string) map[string]any {
		t.Helper()
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("not JSON: %v: %s", err, s)
		}
		return m
	}
	// run puts --url right after the command words.
	run := func(args ...string) string {
		t.Helper()
		words := 1
		if args[0] == "schema" || args[0] == "bench" || args[0] == "cluster" {
			words = 2
		}
		full := append(append(append([]string{}, args[:words]...), "--url", s.URL), args[words:]...)
		out, err := exec.Command(Binary(t), full...).Output()
		if err != nil {
			stderr := ""
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("cortado %v: %v\n%s", full, err, stderr)
		}
		return string(out)
	}

	w := jsonOf(run("put", "-d", `{"firstName":{"en":"Ada"},"lastName":"L"}`, "demo/Profile/1"))
	if w["created"] != true || w["scn"] != "1:1" || w["etag"] == nil {
		t.Fatalf("put printed %v", w)
	}
	d := jsonOf(run("get", "--fields", "lastName", "demo/Profile/1"))
	if len(d) != 1 || d["lastName"] != "L" {
		t.Fatalf("get printed %v", d)
	}
	// Flags may also follow the path.
	if d := jsonOf(run("get", "demo/Profile/1", "--fields", "firstName")); len(d) != 1 || d["firstName"] == nil {
		t.Fatalf("get with --fields after the path printed %v", d)
	}
	run("patch", "-d", `{"set":{"headline":"hi"}}`, "demo/Profile/1")
	if d := jsonOf(run("get", "demo/Profile/1")); d["headline"] != "hi" {
		t.Fatalf("after patch %v", d)
	}
	for range 3 {
		run("insert", "-d", `{"from":"a","subject":"s"}`, "demo/Message/box")
	}
	lines := strings.Split(strings.TrimSpace(run("query", "--limit", "2", "--all", "demo/Message/box")), "\n")
	if len(lines) != 3 {
		t.Fatalf("query --all printed %d lines:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	run("insert", "-d", `{"from":"b","subject":"Big news today","createdOn":7}`, "demo/Message/box")
	run("insert", "-d", `{"from":"b","subject":"old news","createdOn":9}`, "demo/Message/box")
	lines = strings.Split(strings.TrimSpace(run("query", "--where", "from:b AND news", "--sort", "-createdOn", "demo/Message/box")), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "old news") || !strings.Contains(lines[1], "Big news") {
		t.Fatalf("query --where --sort printed:\n%s", strings.Join(lines, "\n"))
	}
	if tbl := jsonOf(run("schema", "show", "demo/Message")); tbl["latest"].(float64) != 1 {
		t.Fatalf("schema show %v", tbl)
	}
	// A database made with a retention, and its retention changed.
	run("schema", "create-db", "kept", "--partitions", "2", "--retention-max-bytes", "4096")
	db := jsonOf(run("schema", "alter-db", "kept", "--retention-max-age", "72h"))
	if r, _ := db["retention"].(map[string]any); r["maxAge"] != "72h0m0s" || r["maxBytes"] != float64(4096) || db["partitions"] != float64(2) {
		t.Fatalf("schema alter-db printed %v", db)
	}
	// A path with an empty part ("demo/Message/box/$id" with $id empty)
	// is refused: trimmed, it named the collection and deleted it.
	for _, path := range []string{"demo/Message/box/", "demo//Message/box", "demo/Message/box//"} {
		out, err := exec.Command(Binary(t), "delete", "--url", s.URL, path).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "empty part") {
			t.Fatalf("delete %s: %v %s", path, err, out)
		}
	}
	// Backup to a file (written whole, no temporary left beside it) and
	// restore into a new database: the same document, as written.
	dir := t.TempDir()
	bak := dir + "/demo.bak"
	run("backup", "demo", "-o", bak)
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("backup left %d files", len(ents))
	}
	run("restore", "-q", "--as", "copy", bak)
	if a, b := run("get", "demo/Message/box/4"), run("get", "copy/Message/box/4"); a != b || !strings.Contains(a, "Big news") {
		t.Fatalf("restored:\n%s\nsource:\n%s", b, a)
	}
	if out, err := exec.Command(Binary(t), "restore", "--url", s.URL, "--as", "copy", bak).CombinedOutput(); err == nil || !strings.Contains(string(out), "database copy exists") {
		t.Fatalf("restore into an existing database: %v %s", err, out)
	}
	// Gzip-compressed, by the file's name, and read back as such.
	run("backup", "demo", "-o", bak+".gz")
	if f, err := os.ReadFile(bak + ".gz"); err != nil || len(f) < 2 || f[0] != 0x1f || f[1] != 0x8b {
		t.Fatalf("backup -o %s.gz did not write gzip: %v", bak, err)
	}
	run("restore", "-q", "--as", "zipped", bak+".gz")
	if a, b := run("get", "demo/Message/box/4"), run("get", "zipped/Message/box/4"); a != b {
		t.Fatalf("restored from gzip:\n%s\nsource:\n%s", b, a)
	}
	if del := jsonOf(run("delete", "demo/Message/box")); del["deleted"] != float64(5) {
		t.Fatalf("delete printed %v", del)
	}
	// The bench subcommands parse their flags (a flag defined twice
	// panics at start) and run: a tiny load and overload step.
	run("bench", "load", "--keys", "20", "--workers", "2")
	tbl := run("bench", "overload", "--servers", "self="+s.URL, "--keys", "20", "--capacity", "50", "--multiples", "1", "--duration", "300ms")
	if !strings.Contains(tbl, "| 1.00C (50/s) | self |") {
		t.Fatalf("bench overload printed:\n%s", tbl)
	}
	// The stall bench stops a process (here the whole server, briefly)
	// and continues it.
	tbl = run("bench", "stall", "--routers", "self="+s.URL, "--keys", "20", "--read-rate", "100", "--rounds", "1",
		"--pid", strconv.Itoa(s.Pid()), "--duration", "1s", "--stop-at", "300ms", "--stop-for", "200ms")
	if !strings.Contains(tbl, "| self | 1 |") {
		t.Fatalf("bench stall printed:\n%s", tbl)
	}
	// The cluster commands say that one node is not a cluster, rather
	// than show an empty one (or, checking a database, find none).
	for _, cmd := range [][]string{{"cluster", "status"}, {"cluster", "check"}, {"cluster", "check", "--db", "demo"}} {
		if out := run(cmd...); !strings.HasPrefix(out, "one storage node, not a cluster") {
			t.Fatalf("cortado %v printed:\n%s", cmd, out)
		}
	}
	// A failing command exits non-zero with the problem on stderr.
	out, err := exec.Command(Binary(t), "get", "--url", s.URL, "demo/Profile/99").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "404 Document not found") {
		t.Fatalf("get of a missing document: %v %s", err, out)
	}
}

// TestRolesRefuseFlagsOutOfRange: a flag outside its range stops a role
// at once, naming it, before anything is opened (a lease TTL of -3
// panicked in a ticker once the cluster ran; a body limit of -1 refused
// every body).
func TestRolesRefuseFlagsOutOfRange(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"serve", "--lease-ttl", "-3"},
		{"serve", "--nodes", "0"},
		{"serve", "--max-body-bytes", "-1"},
		{"serve", "--idle-timeout", "0s"},
		{"serve", "--check-interval", "-1s"},
		{"storage", "--etcd-endpoints", "http://127.0.0.1:1", "--max-transitions", "0"},
		{"relay", "--etcd-endpoints", "http://127.0.0.1:1", "--buffer", "-5"},
		{"router", "--etcd-endpoints", "http://127.0.0.1:1", "--max-body-bytes", "16777217"},
	} {
		cmd := exec.Command(Binary(t), append(args, "--listen", "127.0.0.1:0")...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "--"+strings.TrimPrefix(args[len(args)-2], "--")+" must be") {
			t.Fatalf("cortado %v: %v\n%s", args, err, out)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a refused start left %d entries in its directory", len(entries))
	}
}

// TestVersion: `cortado version` names the binary's build, protocol range
// and storage format, and a running node says the same of itself in
// /_cluster and every process in cortado_build_info: what an operator
// compares during a rolling upgrade.
func TestVersion(t *testing.T) {
	v, ok := versionOf(t, Binary(t))
	if !ok || v.minProtocol != wire.MinVersion || v.maxProtocol != wire.Version || v.format != storage.FormatVersion {
		t.Fatalf("cortado version: %+v (%v), want protocols %d to %d, storage format %d", v, ok, wire.MinVersion, wire.Version, storage.FormatVersion)
	}
	build := v.build

	// Replicated, so that the node registers as a cluster member.
	s := StartServe(t, ServeOptions{Args: []string{"--nodes", "2"}})
	type built struct {
		Role     string
		Build    string
		Protocol uint32
	}
	var st struct {
		Nodes     []built
		Processes []built
	}
	resp, err := http.Get(s.URL + "/_cluster")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Nodes) != 2 {
		t.Fatalf("/_cluster lists %+v (%v), want two nodes", st.Nodes, err)
	}
	for _, n := range st.Nodes {
		if n.Build != build || n.Protocol != wire.Version {
			t.Fatalf("/_cluster lists %+v, want nodes of build %s, protocol %d", st.Nodes, build, wire.Version)
		}
	}
	// serve's other roles, by role.
	if want := []built{{"controller", build, wire.Version}, {"relay", build, wire.Version}, {"router", build, wire.Version}}; !slices.Equal(st.Processes, want) {
		t.Fatalf("/_cluster lists processes %+v, want %+v", st.Processes, want)
	}
	resp, err = http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := fmt.Sprintf(`cortado_build_info{build=%q,`, build); !strings.Contains(string(m), want) {
		t.Fatalf("/metrics has no %s", want)
	}
}
