package clustertest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
)

// collect reads events from a change stream until n change events (and
// whatever came between) arrived or the deadline passes.
func collect(t *testing.T, cl *client.Client, db string, o *client.ChangeOptions, n int, match func(*client.ChangeEvent) bool) []*client.ChangeEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []*client.ChangeEvent
	got := 0
	for e, err := range cl.Changes(ctx, db, o) {
		if err != nil {
			t.Fatalf("after %d events (%d matching of %d): %v", len(out), got, n, err)
		}
		out = append(out, e)
		if match(e) {
			if got++; got == n {
				break
			}
		}
	}
	return out
}

func isChange(e *client.ChangeEvent) bool { return e.Type == "change" }

func changeEvents(es []*client.ChangeEvent) []*client.ChangeEvent {
	var out []*client.ChangeEvent
	for _, e := range es {
		if e.Type == "change" {
			out = append(out, e)
		}
	}
	return out
}

// TestChangeStream runs the change stream of a single node: the envelope,
// filters, projection, pre-images, transactions, resuming from any
// event's token without repeating or skipping one, resolved events for a
// quiet filter, and Server-Sent Events resumed by curl with
// Last-Event-ID.
func TestChangeStream(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo"}})
	h := httpCase{t, s.URL}
	cl := client.New(s.URL)
	defer cl.Close()
	h.want(h.do("PUT", "/demo/MailboxStats/alice", nil, `{"total":1,"unread":1}`), 201)
	h.want(h.do("PATCH", "/demo/MailboxStats/alice", nil, `{"increment":{"total":1}}`), 204)
	h.want(h.do("POST", "/demo/Message/alice", nil, `{"from":"bob","subject":"hi"}`), 201)
	h.want(h.do("POST", "/demo/_txn/alice", nil, `{"ops":[
		{"op":"put","table":"Message","key":["alice",7],"document":{"from":"carol","subject":"a"}},
		{"op":"put","table":"MailboxStats","key":["alice"],"document":{"total":3,"unread":2}}]}`), 200)
	h.want(h.do("DELETE", "/demo/MailboxStats/alice", nil, ""), 204)

	all := changeEvents(collect(t, cl, "demo", &client.ChangeOptions{Before: true}, 6, isChange))
	type ev struct{ op, table, key string }
	var got []ev
	for _, e := range all {
		k, _ := json.Marshal(e.Source.Key)
		got = append(got, ev{e.Op, e.Source.Table, string(k)})
	}
	want := []ev{{"c", "MailboxStats", `["alice"]`}, {"u", "MailboxStats", `["alice"]`}, {"c", "Message", `["alice",1]`},
		{"c", "Message", `["alice",7]`}, {"u", "MailboxStats", `["alice"]`}, {"d", "MailboxStats", `["alice"]`}}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	// Envelope: pre-images on request, post-images, SCNs in order, one
	// SCN and contiguous orders inside the transaction.
	if string(all[1].Before) != `{"total":1,"unread":1}` || string(all[1].After) != `{"total":2,"unread":1}` || string(all[5].After) != "" && string(all[5].After) != "null" {
		t.Fatalf("images: %s → %s; delete after %s", all[1].Before, all[1].After, all[5].After)
	}
	if all[3].Source.SCN != all[4].Source.SCN || all[3].Transaction.TotalOrder != 1 || all[4].Transaction.TotalOrder != 2 || all[3].Transaction.ID != fmt.Sprintf("%d/%s", all[3].Source.Partition, all[3].Source.SCN) {
		t.Fatalf("transaction: %+v %+v / %+v %+v", all[3].Source, all[3].Transaction, all[4].Source, all[4].Transaction)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Source.Sequence < all[i-1].Source.Sequence || all[i].Source.Snapshot != "false" || all[i].Source.DB != "demo" {
			t.Fatalf("event %d: %+v after %+v", i, all[i].Source, all[i-1].Source)
		}
	}

	// Resuming from each event's token gives exactly the events after it.
	for i := range len(all) - 1 {
		rest := changeEvents(collect(t, cl, "demo", &client.ChangeOptions{Since: all[i].Token}, 1, isChange))
		if len(rest) != 1 || rest[0].Source.SCN != all[i+1].Source.SCN || rest[0].Source.Table != all[i+1].Source.Table || rest[0].Op != all[i+1].Op ||
			*rest[0].Transaction != *all[i+1].Transaction {
			t.Fatalf("resumed after event %d (%s %s): got %+v %+v, want %+v %+v", i, all[i].Source.SCN, all[i].Source.Table, rest[0].Source, rest[0].Transaction, all[i+1].Source, all[i+1].Transaction)
		}
	}
	// Resumed inside the transaction, with its boundaries: no BEGIN, the
	// second change, and an END that counts both.
	var inside []*client.ChangeEvent
	for _, e := range collect(t, cl, "demo", &client.ChangeOptions{Since: all[3].Token, Transactions: true}, 1, func(e *client.ChangeEvent) bool {
		return e.Type == "transaction" && e.Status == "END"
	}) {
		if e.Type != "resolved" {
			inside = append(inside, e)
		}
	}
	if len(inside) != 2 || inside[0].Type != "change" || inside[0].Transaction.TotalOrder != 2 || inside[1].EventCount == nil || *inside[1].EventCount != 2 {
		var raw []string
		for _, e := range inside {
			raw = append(raw, string(e.Raw))
		}
		t.Fatalf("resumed inside the transaction: %s", strings.Join(raw, "\n"))
	}

	// Filters and projection; transaction boundaries.
	msgs := collect(t, cl, "demo", &client.ChangeOptions{Tables: []string{"Message"}, Fields: []string{"subject"}, Transactions: true}, 2, isChange)
	var kinds []string
	for _, e := range msgs {
		if e.Type == "change" {
			if e.Source.Table != "Message" || !strings.HasPrefix(string(e.After), `{"subject":`) {
				t.Fatalf("filtered event %s", e.Raw)
			}
			kinds = append(kinds, "change")
		} else if e.Type == "transaction" {
			kinds = append(kinds, e.Status)
			if want := fmt.Sprintf("%d/%s", e.Source.Partition, e.Source.SCN); e.ID != want {
				t.Fatalf("transaction id %q, want %q (unique in the database): %s", e.ID, want, e.Raw)
			}
			if e.Status == "END" && (e.EventCount == nil || *e.EventCount != 1) {
				t.Fatalf("END of a one-event (after filtering) transaction: %s", e.Raw)
			}
		}
	}
	if !slices.Equal(kinds, []string{"BEGIN", "change", "END", "BEGIN", "change"}) {
		t.Fatalf("with transactions: %v", kinds)
	}

	// A quiet table's consumer still advances: resolved events carry the
	// partition's position past commits its filter left out.
	quiet := collect(t, cl, "demo", &client.ChangeOptions{Tables: []string{"Profile"}, Since: all[len(all)-1].Token}, 1, func(e *client.ChangeEvent) bool {
		return e.Type == "resolved" && e.Source.Partition == all[0].Source.Partition
	})
	start := quiet[len(quiet)-1]
	h.want(h.do("PUT", "/demo/MailboxStats/alice", nil, `{"total":9,"unread":9}`), 201)
	moved := collect(t, cl, "demo", &client.ChangeOptions{Tables: []string{"Profile"}, Since: start.Token, Heartbeat: 100 * time.Millisecond}, 1, func(e *client.ChangeEvent) bool {
		return e.Type == "resolved" && e.Source.Partition == start.Source.Partition && e.Source.Sequence > start.Source.Sequence
	})
	if last := moved[len(moved)-1]; last.Token == start.Token {
		t.Fatalf("the resolved event did not move the token")
	}

	// Bad requests are problems, before any event.
	h.problem(h.do("GET", "/demo/_changes?since=bogus", nil, ""), 400, "urn:cortado:problem:invalid-token")
	h.problem(h.do("GET", "/demo/_changes?tables=Nope", nil, ""), 404, "urn:cortado:problem:no-such-table")
	h.problem(h.do("GET", "/demo/_changes?fields=nope", nil, ""), 400, "urn:cortado:problem:malformed-request")
	h.problem(h.do("GET", "/demo/_changes?partitions=64", nil, ""), 400, "urn:cortado:problem:malformed-request")
	h.problem(h.do("GET", "/nodb/_changes", nil, ""), 404, "urn:cortado:problem:no-such-database")

	// curl, Server-Sent Events, resumed with Last-Event-ID: the events
	// after the second one, ids being tokens.
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl not installed")
	}
	cmd := exec.Command("curl", "-sN", "--max-time", "5", "-H", "Accept: text/event-stream", "-H", "Last-Event-ID: "+all[1].Token, s.URL+"/demo/_changes?tables=Message,MailboxStats")
	outPipe, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(outPipe)
	sc.Buffer(nil, 1<<20)
	var ids, events []string
	for sc.Scan() && len(events) < 4 {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			ids = append(ids, strings.TrimPrefix(line, "id: "))
		case strings.HasPrefix(line, "data: "):
			var e client.ChangeEvent
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &e); err != nil {
				t.Fatalf("SSE data %q: %v", line, err)
			}
			if e.Token != ids[len(ids)-1] {
				t.Fatalf("SSE id %q is not the event's token %q", ids[len(ids)-1], e.Token)
			}
			if e.Type == "change" {
				events = append(events, fmt.Sprint(e.Op, " ", e.Source.SCN))
			}
		}
	}
	wantSSE := []string{}
	for _, e := range all[2:6] {
		wantSSE = append(wantSSE, fmt.Sprint(e.Op, " ", e.Source.SCN))
	}
	if !slices.Equal(events, wantSSE) {
		t.Fatalf("curl with Last-Event-ID: %v, want %v", events, wantSSE)
	}
}

// TestChangeStreamUnrenderable: a change the stream cannot render in the
// version it asks for (a double a promotion allowed, read back as the
// long of the earlier version) ends the stream with an "error" event: a
// problem naming the field and the change, and a token that resumes at
// it. The partition's reader retried it forever, silently: the consumer
// got neither the change nor an error.
func TestChangeStreamUnrenderable(t *testing.T) {
	ctx := context.Background()
	ts, cl := demoOverHTTP(t)
	v2 := `{"type":"record","name":"MailboxStats","namespace":"demo","fields":[{"name":"total","type":"long","default":0},{"name":"unread","type":"double","default":0}]}`
	if _, err := cl.RegisterSchema(ctx, "demo", "MailboxStats", client.TableSchema{Schema: json.RawMessage(v2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Put(ctx, "demo", "MailboxStats", client.Key{"half"}, map[string]any{"total": 1, "unread": 2.5}, nil); err != nil {
		t.Fatal(err)
	}
	// The Go client: the iteration ends with the problem.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var last error
	for _, err := range cl.Changes(cctx, "demo", &client.ChangeOptions{Tables: []string{"MailboxStats"}, Version: 1}) {
		if err != nil {
			last = err
			break
		}
	}
	var ce *client.Error
	if !errors.As(last, &ce) || ce.Status != 400 || ce.Field != "unread" || !strings.Contains(ce.Detail, "SCN 1:1") {
		t.Fatalf("a version-1 stream met a change it cannot render: %v, want a 400 naming unread and SCN 1:1", last)
	}
	// The CLI stops with the problem, and a non-zero exit.
	out, err := exec.Command(Binary(t), "tail", "demo", "--url", ts.URL, "--tables", "MailboxStats", "--version", "1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "400 Change cannot be rendered") {
		t.Fatalf("cortado tail --version 1: %v\n%s", err, out)
	}
	// NDJSON: the error line ends the stream, and its token resumes at
	// the change, which version 2 renders.
	resp, err := http.Get(ts.URL + "/demo/_changes?tables=MailboxStats&version=1")
	if err != nil {
		t.Fatal(err)
	}
	var token string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var e struct{ Type, Token string }
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Type == "error" {
			token = e.Token
		}
	}
	resp.Body.Close()
	if token == "" {
		t.Fatal("the version-1 stream ended without an error event")
	}
	got := collect(t, cl, "demo", &client.ChangeOptions{Since: token, Tables: []string{"MailboxStats"}, Version: 2}, 1, isChange)
	if e := got[len(got)-1]; fmt.Sprint(e.Source.Key) != "[half]" || string(e.After) != `{"total":1,"unread":2.5}` {
		t.Fatalf("resumed from the error's token in version 2: %s", e.Raw)
	}
}

// A change's source.schemaVersion is the version its before and after
// are rendered in, as X-Cortado-Schema-Version is a read's: the stream's
// version, or the table's latest, whatever version the document was
// written in.
func TestChangeStreamNamesItsVersion(t *testing.T) {
	ctx := context.Background()
	cl := demoClient(t)
	if _, err := cl.Put(ctx, "demo", "MailboxStats", client.Key{"old"}, map[string]any{"total": 1}, nil); err != nil {
		t.Fatal(err)
	}
	v2 := `{"type":"record","name":"MailboxStats","namespace":"demo","fields":[{"name":"total","type":"long","default":0},{"name":"unread","type":"long","default":0},{"name":"flagged","type":"long","default":0}]}`
	if _, err := cl.RegisterSchema(ctx, "demo", "MailboxStats", client.TableSchema{Schema: json.RawMessage(v2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Put(ctx, "demo", "MailboxStats", client.Key{"old"}, map[string]any{"total": 2, "flagged": 1}, nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		version            int
		want               int
		created, upd, prev string
	}{
		{0, 2, `{"total":1,"unread":0,"flagged":0}`, `{"total":2,"unread":0,"flagged":1}`, `{"total":1,"unread":0,"flagged":0}`},
		{1, 1, `{"total":1,"unread":0}`, `{"total":2,"unread":0}`, `{"total":1,"unread":0}`},
		{2, 2, `{"total":1,"unread":0,"flagged":0}`, `{"total":2,"unread":0,"flagged":1}`, `{"total":1,"unread":0,"flagged":0}`},
	} {
		got := changeEvents(collect(t, cl, "demo", &client.ChangeOptions{Tables: []string{"MailboxStats"}, Version: tc.version, Before: true}, 2, isChange))
		c, u := got[0], got[1]
		if c.Source.SchemaVersion != tc.want || u.Source.SchemaVersion != tc.want ||
			string(c.After) != tc.created || string(u.After) != tc.upd || string(u.Before) != tc.prev {
			t.Fatalf("version=%d: want schemaVersion %d\n%s\n%s", tc.version, tc.want, c.Raw, u.Raw)
		}
	}
}
