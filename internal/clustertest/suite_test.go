package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/client/embedded"
)

// The same suite runs against a real `cortado serve` over HTTP and against
// an embedded client in this process.

func TestClientSuiteHTTP(t *testing.T) {
	s := StartServe(t, ServeOptions{})
	c := client.New(s.URL)
	defer c.Close()
	runSuite(t, c)
}

func TestClientSuiteEmbedded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c, err := embedded.Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	runSuite(t, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The directory reopens with everything in it.
	c, err = embedded.Open(ctx, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d, err := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, nil)
	if err != nil {
		t.Fatalf("after reopen: %v", err)
	}
	wantJSON(t, d.Body, `{"total":6,"unread":1,"owner":"nobody"}`)
}

const messageV1 = `{"type":"record","name":"Message","namespace":"mail","fields":[
 {"name":"from","type":"string"},
 {"name":"subject","type":"string"},
 {"name":"size","type":"int"},
 {"name":"draft","type":"boolean","default":false},
 {"name":"meta","type":{"type":"map","values":{"type":"record","name":"Meta","fields":[{"name":"a","type":"string"},{"name":"b","type":"int"}]}},"default":{}},
 {"name":"to","type":{"type":"array","items":{"type":"record","name":"Addr","fields":[{"name":"name","type":"string"},{"name":"email","type":"string"}]}},"default":[]},
 {"name":"reply","type":["null",{"type":"record","name":"Reply","fields":[{"name":"id","type":"long"},{"name":"quote","type":"string"}]}],"default":null}]}`

// v2 adds a field with a default.
const messageV2 = `{"type":"record","name":"Message","namespace":"mail","fields":[
 {"name":"from","type":"string"},
 {"name":"subject","type":"string"},
 {"name":"size","type":"int"},
 {"name":"draft","type":"boolean","default":false},
 {"name":"meta","type":{"type":"map","values":{"type":"record","name":"Meta","fields":[{"name":"a","type":"string"},{"name":"b","type":"int"}]}},"default":{}},
 {"name":"to","type":{"type":"array","items":{"type":"record","name":"Addr","fields":[{"name":"name","type":"string"},{"name":"email","type":"string"}]}},"default":[]},
 {"name":"reply","type":["null",{"type":"record","name":"Reply","fields":[{"name":"id","type":"long"},{"name":"quote","type":"string"}]}],"default":null},
 {"name":"priority","type":"int","default":3}]}`

// v3 removes draft (it had a default) and promotes size from int to long.
const messageV3 = `{"type":"record","name":"Message","namespace":"mail","fields":[
 {"name":"from","type":"string"},
 {"name":"subject","type":"string"},
 {"name":"size","type":"long"},
 {"name":"meta","type":{"type":"map","values":{"type":"record","name":"Meta","fields":[{"name":"a","type":"string"},{"name":"b","type":"int"}]}},"default":{}},
 {"name":"to","type":{"type":"array","items":{"type":"record","name":"Addr","fields":[{"name":"name","type":"string"},{"name":"email","type":"string"}]}},"default":[]},
 {"name":"reply","type":["null",{"type":"record","name":"Reply","fields":[{"name":"id","type":"long"},{"name":"quote","type":"string"}]}],"default":null},
 {"name":"priority","type":"int","default":3}]}`

const statsV1 = `{"type":"record","name":"Stats","namespace":"mail","fields":[
 {"name":"total","type":"long","default":0},{"name":"unread","type":"long","default":0},{"name":"owner","type":"string","default":"nobody"}]}`

func wantJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("not JSON: %v: %s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad expectation: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func wantErr(t *testing.T, err error, target error) *client.Error {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("want %v, got %v", target, err)
	}
	var ce *client.Error
	errors.As(err, &ce)
	return ce
}

func runSuite(t *testing.T, c *client.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.CreateDatabase(ctx, "mail", client.Database{Partitions: 8}))
	must(c.CreateDatabase(ctx, "mail", client.Database{Partitions: 8})) // idempotent
	if err := c.CreateDatabase(ctx, "mail", client.Database{Partitions: 16}); err == nil {
		t.Fatal("redefining a database succeeded")
	}
	msgKey := []client.KeyPart{{Name: "mailboxId"}, {Name: "messageId", Type: "long", AutoIncrement: true}}
	v, err := c.RegisterSchema(ctx, "mail", "Message", client.TableSchema{Key: msgKey, Schema: json.RawMessage(messageV1)})
	if err != nil || v != 1 {
		t.Fatalf("register v1: %d %v", v, err)
	}
	if _, err := c.RegisterSchema(ctx, "mail", "Stats", client.TableSchema{Key: []client.KeyPart{{Name: "mailboxId"}}, Schema: json.RawMessage(statsV1)}); err != nil {
		t.Fatal(err)
	}

	t.Run("insert and read back as written", func(t *testing.T) {
		w, err := c.Insert(ctx, "mail", "Message", client.Key{"alice"}, json.RawMessage(`{"from":"bob","subject":"hi","size":10,
			"meta":{"x":{"a":"1","b":2},"y":{"a":"3","b":4}},"to":[{"name":"A","email":"a@x"},{"name":"C","email":"c@x"}],
			"reply":{"id":7,"quote":"q"}}`))
		if err != nil {
			t.Fatal(err)
		}
		if !w.Created || !reflect.DeepEqual(w.Key, client.Key{"alice", int64(1)}) || w.SCN == "" || w.ETag == "" {
			t.Fatalf("insert result %+v", w)
		}
		d, err := c.Get(ctx, "mail", "Message", client.Key{"alice", 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantJSON(t, d.Body, `{"from":"bob","subject":"hi","size":10,"draft":false,"meta":{"x":{"a":"1","b":2},"y":{"a":"3","b":4}},
			"to":[{"name":"A","email":"a@x"},{"name":"C","email":"c@x"}],"reply":{"id":7,"quote":"q"}}`)
		if d.ETag != w.ETag || d.SCN != w.SCN || d.SchemaVersion != 1 {
			t.Fatalf("read metadata %+v vs write %+v", d, w)
		}
		w2, err := c.Insert(ctx, "mail", "Message", client.Key{"alice"}, map[string]any{"from": "carol", "subject": "s2", "size": 20, "draft": true})
		if err != nil || !reflect.DeepEqual(w2.Key, client.Key{"alice", int64(2)}) {
			t.Fatalf("second insert: %+v %v", w2, err)
		}
	})

	t.Run("schema evolution across three versions", func(t *testing.T) {
		if v, err := c.RegisterSchema(ctx, "mail", "Message", client.TableSchema{Schema: json.RawMessage(messageV2)}); err != nil || v != 2 {
			t.Fatalf("v2: %d %v", v, err)
		}
		if v, err := c.RegisterSchema(ctx, "mail", "Message", client.TableSchema{Schema: json.RawMessage(messageV3)}); err != nil || v != 3 {
			t.Fatalf("v3: %d %v", v, err)
		}
		// Same text again is the same version.
		if v, err := c.RegisterSchema(ctx, "mail", "Message", client.TableSchema{Schema: json.RawMessage(messageV3)}); err != nil || v != 3 {
			t.Fatalf("v3 again: %d %v", v, err)
		}
		// A version-1 document reads as version 3: draft gone, priority
		// defaulted, size promoted.
		d, err := c.Get(ctx, "mail", "Message", client.Key{"alice", 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantJSON(t, d.Body, `{"from":"carol","subject":"s2","size":20,"meta":{},"to":[],"reply":null,"priority":3}`)
		if d.SchemaVersion != 3 {
			t.Fatalf("schema version %d", d.SchemaVersion)
		}
		// And as version 2, and as version 1.
		d, err = c.Get(ctx, "mail", "Message", client.Key{"alice", 2}, &client.ReadOptions{Version: 2, Fields: []string{"draft", "priority"}})
		if err != nil {
			t.Fatal(err)
		}
		wantJSON(t, d.Body, `{"draft":true,"priority":3}`)
		// A version-3 write read as version 1: draft takes its default.
		if _, err := c.Put(ctx, "mail", "Message", client.Key{"alice", 3}, map[string]any{"from": "dan", "subject": "v3", "size": 30, "priority": 1}, nil); err != nil {
			t.Fatal(err)
		}
		d, err = c.Get(ctx, "mail", "Message", client.Key{"alice", 3}, &client.ReadOptions{Version: 1, Fields: []string{"size", "draft"}})
		if err != nil {
			t.Fatal(err)
		}
		wantJSON(t, d.Body, `{"size":30,"draft":false}`)
		// An incompatible version is refused, naming the field.
		bad := `{"type":"record","name":"Message","namespace":"mail","fields":[{"name":"from","type":"int"}]}`
		_, err = c.RegisterSchema(ctx, "mail", "Message", client.TableSchema{Schema: json.RawMessage(bad)})
		ce := wantErr(t, err, client.ErrIncompatibleSchema)
		if ce.Status != 409 || ce.Field == "" {
			t.Fatalf("incompatible schema problem %+v", ce)
		}
		info, _ := c.Table(ctx, "mail", "Message")
		if info.Latest != 3 {
			t.Fatalf("refused version changed the table: %+v", info)
		}
		s1, err := c.Schema(ctx, "mail", "Message", 1)
		if err != nil || len(s1) == 0 {
			t.Fatalf("schema v1: %v", err)
		}
	})

	t.Run("client-side plans give the server's bytes", func(t *testing.T) {
		for _, o := range []*client.ReadOptions{nil, {Version: 1}, {Version: 2, Fields: []string{"draft", "priority"}},
			{Fields: []string{"meta.b", "to.email", "reply.quote"}}} {
			for _, k := range []client.Key{{"alice", 1}, {"alice", 2}, {"alice", 3}} {
				server, err := c.Get(ctx, "mail", "Message", k, o)
				if err != nil {
					t.Fatal(err)
				}
				local, err := c.ReadAs(ctx, "mail", "Message", k, o)
				if err != nil {
					t.Fatal(err)
				}
				if string(server.Body) != string(local.Body) || server.SchemaVersion != local.SchemaVersion || server.ETag != local.ETag {
					t.Fatalf("%v %+v: server %s (v%d), client %s (v%d)", k, o, server.Body, server.SchemaVersion, local.Body, local.SchemaVersion)
				}
			}
		}
	})

	t.Run("projection through maps arrays unions", func(t *testing.T) {
		d, err := c.Get(ctx, "mail", "Message", client.Key{"alice", 1}, &client.ReadOptions{Fields: []string{"meta.b", "to.email", "reply.quote", "subject"}})
		if err != nil {
			t.Fatal(err)
		}
		wantJSON(t, d.Body, `{"subject":"hi","meta":{"x":{"b":2},"y":{"b":4}},"to":[{"email":"a@x"},{"email":"c@x"}],"reply":{"quote":"q"}}`)
		_, err = c.Get(ctx, "mail", "Message", client.Key{"alice", 1}, &client.ReadOptions{Fields: []string{"nope"}})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 400 || ce.Field != "nope" {
			t.Fatalf("bad projection: %v", err)
		}
	})

	t.Run("collection paging and multi-get", func(t *testing.T) {
		for i := range 5 {
			if _, err := c.Put(ctx, "mail", "Message", client.Key{"bob", 10 + i}, map[string]any{"from": "x", "subject": fmt.Sprint(i), "size": i}, nil); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		next := ""
		pages := 0
		for {
			p, err := c.Collection(ctx, "mail", "Message", client.Key{"bob"}, 2, next, &client.ReadOptions{Fields: []string{"subject"}})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, d := range p.Documents {
				var m struct{ Subject string }
				d.Decode(&m)
				got = append(got, fmt.Sprint(d.Key[1], ":", m.Subject))
			}
			if next = p.Next; next == "" {
				break
			}
		}
		if fmt.Sprint(got) != "[10:0 11:1 12:2 13:3 14:4]" || pages != 3 {
			t.Fatalf("collection = %v in %d pages", got, pages)
		}
		p, err := c.MultiGet(ctx, "mail", "Message", []client.Key{{"bob", 12}, {"bob", 99}, {"bob", 10}}, &client.ReadOptions{Fields: []string{"size"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Documents) != 2 || !reflect.DeepEqual(p.Documents[0].Key, client.Key{"bob", int64(12)}) ||
			!reflect.DeepEqual(p.Missing, []client.Key{{"bob", int64(99)}}) {
			t.Fatalf("multi-get %+v", p)
		}
		wantJSON(t, p.Documents[1].Body, `{"size":0}`)
		// Streamed: one partition's keys in request order, the absent
		// one marked; the same documents as the page's.
		var streamed []*client.Document
		for d, err := range c.MultiGetStream(ctx, "mail", "Message", []client.Key{{"bob", 12}, {"bob", 99}, {"bob", 10}}, &client.ReadOptions{Fields: []string{"size"}}) {
			if err != nil {
				t.Fatal(err)
			}
			streamed = append(streamed, d)
		}
		if len(streamed) != 3 || !streamed[1].NotFound || !reflect.DeepEqual(streamed[1].Key, client.Key{"bob", int64(99)}) ||
			!reflect.DeepEqual(*streamed[0], p.Documents[0]) || !reflect.DeepEqual(*streamed[2], p.Documents[1]) {
			t.Fatalf("streamed multi-get %+v, page %+v", streamed, p.Documents)
		}
		for range c.MultiGetStream(ctx, "mail", "Message", []client.Key{{"bob", 12}, {"bob", 10}}, nil) {
			break // leaving early ends the stream
		}
		for _, err := range c.MultiGetStream(ctx, "mail", "Message", []client.Key{{"bob", "x"}}, nil) {
			if e := (*client.Error)(nil); !errors.As(err, &e) || e.Type != "urn:cortado:problem:invalid-key" {
				t.Fatalf("a streamed multi-get of a bad key: %v", err)
			}
		}
		// Across document groups (partitions).
		p, err = c.MultiGet(ctx, "mail", "Stats", []client.Key{{"nobody1"}, {"nobody2"}}, nil)
		if err != nil || len(p.Missing) != 2 {
			t.Fatalf("multi-get across groups: %+v %v", p, err)
		}
		n := 0
		for d, err := range c.MultiGetStream(ctx, "mail", "Stats", []client.Key{{"nobody1"}, {"nobody2"}}, nil) {
			if err != nil || !d.NotFound {
				t.Fatalf("streamed across groups: %+v %v", d, err)
			}
			n++
		}
		if n != 2 {
			t.Fatalf("streamed across groups: %d keys", n)
		}
	})

	t.Run("patch set remove increment", func(t *testing.T) {
		if _, err := c.Put(ctx, "mail", "Stats", client.Key{"alice"}, map[string]any{"total": 1, "owner": "al"}, nil); err != nil {
			t.Fatal(err)
		}
		w, err := c.Patch(ctx, "mail", "Stats", client.Key{"alice"}, client.Patch{Increment: map[string]any{"total": 4, "unread": 1}, Remove: []string{"owner"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, nil)
		wantJSON(t, d.Body, `{"total":5,"unread":1,"owner":"nobody"}`)
		if d.ETag != w.ETag {
			t.Fatalf("patch etag %s, read %s", w.ETag, d.ETag)
		}
		_, err = c.Patch(ctx, "mail", "Stats", client.Key{"alice"}, client.Patch{Set: map[string]any{"total": "many"}}, nil)
		wantErr(t, err, client.ErrInvalidDocument)
		_, err = c.Patch(ctx, "mail", "Stats", client.Key{"nobody"}, client.Patch{Set: map[string]any{"total": 1}}, nil)
		wantErr(t, err, client.ErrNotFound)
		// A nested set through a map and a record.
		if _, err := c.Patch(ctx, "mail", "Message", client.Key{"alice", 1}, client.Patch{Set: map[string]any{"meta.z": map[string]any{"a": "5", "b": 6}, "reply.quote": "new"}}, nil); err != nil {
			t.Fatal(err)
		}
		d, _ = c.Get(ctx, "mail", "Message", client.Key{"alice", 1}, &client.ReadOptions{Fields: []string{"meta", "reply"}})
		wantJSON(t, d.Body, `{"meta":{"x":{"a":"1","b":2},"y":{"a":"3","b":4},"z":{"a":"5","b":6}},"reply":{"id":7,"quote":"new"}}`)
	})

	t.Run("conditionals", func(t *testing.T) {
		d, _ := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, nil)
		_, err := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, &client.ReadOptions{Conditions: client.Conditions{IfNoneMatch: d.ETag}})
		if !errors.Is(err, client.ErrNotModified) {
			t.Fatalf("If-None-Match on read: %v", err)
		}
		_, err = c.Get(ctx, "mail", "Stats", client.Key{"alice"}, &client.ReadOptions{Conditions: client.Conditions{IfModifiedSince: d.LastModified}})
		if !errors.Is(err, client.ErrNotModified) {
			t.Fatalf("If-Modified-Since on read: %v", err)
		}
		_, err = c.Put(ctx, "mail", "Stats", client.Key{"alice"}, map[string]any{"total": 0}, &client.Conditions{IfMatch: `"00000000"`})
		if ce := wantErr(t, err, client.ErrPreconditionFailed); ce.Operation != nil {
			t.Fatalf("a single write's problem names operation %d", *ce.Operation)
		}
		_, err = c.Put(ctx, "mail", "Stats", client.Key{"alice"}, map[string]any{"total": 0}, &client.Conditions{IfNoneMatch: "*"})
		wantErr(t, err, client.ErrPreconditionFailed)
		_, err = c.Delete(ctx, "mail", "Stats", client.Key{"alice"}, &client.Conditions{IfUnmodifiedSince: d.LastModified.Add(-time.Hour)})
		wantErr(t, err, client.ErrPreconditionFailed)
		after, _ := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, nil)
		if after.ETag != d.ETag {
			t.Fatal("a failed precondition changed the document")
		}
		w, err := c.Patch(ctx, "mail", "Stats", client.Key{"alice"}, client.Patch{Increment: map[string]any{"total": 0}}, &client.Conditions{IfMatch: d.ETag})
		if err != nil || w.ETag == d.ETag || tagCRC(w.ETag) != tagCRC(d.ETag) {
			t.Fatalf("CAS with the right etag: %+v %v; want a new version (tag) with the bytes of %s", w, err, d.ETag)
		}
		// The tag names the version it was read from: a second CAS with
		// it fails, though the bytes are the same.
		_, err = c.Patch(ctx, "mail", "Stats", client.Key{"alice"}, client.Patch{Increment: map[string]any{"total": 0}}, &client.Conditions{IfMatch: d.ETag})
		wantErr(t, err, client.ErrPreconditionFailed)
		if _, err := c.Put(ctx, "mail", "Stats", client.Key{"carol"}, map[string]any{}, &client.Conditions{IfNoneMatch: "*"}); err != nil {
			t.Fatalf("create-only put: %v", err)
		}
	})

	t.Run("transaction is all or nothing", func(t *testing.T) {
		before, _ := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, nil)
		_, err := c.Txn(ctx, "mail", "alice", []client.TxnOp{
			{Op: "insert", Table: "Message", Key: client.Key{"alice"}, Document: map[string]any{"from": "t", "subject": "t", "size": 1}},
			{Op: "patch", Table: "Stats", Key: client.Key{"alice"}, Patch: &client.Patch{Increment: map[string]any{"total": 1}}},
			{Op: "put", Table: "Stats", Key: client.Key{"alice"}, Document: map[string]any{"total": "bad"}},
		})
		ce := wantErr(t, err, client.ErrInvalidDocument)
		if ce.Operation == nil || *ce.Operation != 2 {
			t.Fatalf("failing op not named: %+v", ce)
		}
		// A transaction of one op names it too, whichever part refuses it.
		for _, op := range []client.TxnOp{
			{Op: "put", Table: "Stats", Key: client.Key{"alice"}, Document: map[string]any{}, IfMatch: `"00000000"`},
			{Op: "patch", Table: "Stats", Key: client.Key{"alice", "x"}, Patch: &client.Patch{Increment: map[string]any{"total": 1}}},
			{Op: "patch", Table: "Stats", Key: client.Key{"nobody"}, Patch: &client.Patch{Increment: map[string]any{"total": 1}}},
		} {
			_, err = c.Txn(ctx, "mail", op.Key[0].(string), []client.TxnOp{op})
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Operation == nil || *ce.Operation != 0 {
				t.Fatalf("one-op transaction %+v: the problem names no operation 0: %v", op, err)
			}
		}
		after, _ := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, nil)
		if after.ETag != before.ETag || after.SCN != before.SCN {
			t.Fatal("failed transaction changed a document")
		}
		p, _ := c.Collection(ctx, "mail", "Message", client.Key{"alice"}, 0, "", nil)
		if len(p.Documents) != 3 {
			t.Fatalf("failed transaction inserted: %d messages", len(p.Documents))
		}
		// Another document group in the body is refused.
		_, err = c.Txn(ctx, "mail", "alice", []client.TxnOp{{Op: "put", Table: "Stats", Key: client.Key{"bob"}, Document: map[string]any{}}})
		var e *client.Error
		if !errors.As(err, &e) || e.Status != 400 {
			t.Fatalf("cross-group transaction: %v", err)
		}
		r, err := c.Txn(ctx, "mail", "alice", []client.TxnOp{
			{Op: "insert", Table: "Message", Key: client.Key{"alice"}, Document: map[string]any{"from": "t", "subject": "t", "size": 1}},
			{Op: "patch", Table: "Stats", Key: client.Key{"alice"}, Patch: &client.Patch{Increment: map[string]any{"total": 1}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		m, _ := c.Get(ctx, "mail", "Message", r.Results[0].Key, nil)
		s, _ := c.Get(ctx, "mail", "Stats", client.Key{"alice"}, nil)
		if m.SCN != r.SCN || s.SCN != r.SCN {
			t.Fatalf("transaction writes do not share one SCN: %s %s %s", m.SCN, s.SCN, r.SCN)
		}
	})

	t.Run("delete document and collection", func(t *testing.T) {
		w, err := c.Delete(ctx, "mail", "Message", client.Key{"bob", 10}, nil)
		if err != nil || w.Deleted != 1 {
			t.Fatalf("delete: %+v %v", w, err)
		}
		_, err = c.Get(ctx, "mail", "Message", client.Key{"bob", 10}, nil)
		wantErr(t, err, client.ErrNotFound)
		_, err = c.Delete(ctx, "mail", "Message", client.Key{"bob", 10}, nil)
		wantErr(t, err, client.ErrNotFound)
		w, err = c.Delete(ctx, "mail", "Message", client.Key{"bob"}, nil)
		if err != nil || w.Deleted != 4 {
			t.Fatalf("delete collection: %+v %v", w, err)
		}
		p, _ := c.Collection(ctx, "mail", "Message", client.Key{"bob"}, 0, "", nil)
		if len(p.Documents) != 0 {
			t.Fatalf("collection not empty: %d", len(p.Documents))
		}
	})

	t.Run("range partitioning", func(t *testing.T) {
		must(c.CreateDatabase(ctx, "ranged", client.Database{Partitioning: "range", Boundaries: []any{"h", "p"}}))
		if _, err := c.RegisterSchema(ctx, "ranged", "Stats", client.TableSchema{Key: []client.KeyPart{{Name: "mailboxId"}}, Schema: json.RawMessage(statsV1)}); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"alice", "h", "mallory", "zed"} {
			if _, err := c.Put(ctx, "ranged", "Stats", client.Key{k}, map[string]any{"total": 1, "unread": 0}, nil); err != nil {
				t.Fatalf("put %s: %v", k, err)
			}
			if _, err := c.Get(ctx, "ranged", "Stats", client.Key{k}, nil); err != nil {
				t.Fatalf("get %s: %v", k, err)
			}
		}
		// An integer partition key cannot live on string boundaries.
		_, err := c.RegisterSchema(ctx, "ranged", "ByNumber", client.TableSchema{Key: []client.KeyPart{{Name: "n", Type: "long"}}, Schema: json.RawMessage(statsV1)})
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != 400 {
			t.Fatalf("integer key on string boundaries: %v", err)
		}
	})

	t.Run("unknown database and table", func(t *testing.T) {
		_, err := c.Get(ctx, "nodb", "Message", client.Key{"a", 1}, nil)
		wantErr(t, err, client.ErrNoDatabase)
		_, err = c.Get(ctx, "mail", "NoTable", client.Key{"a"}, nil)
		wantErr(t, err, client.ErrNoTable)
	})

	t.Run("change stream", func(t *testing.T) {
		// The change stream replayed from the beginning ends at each
		// document's current state; a write after "now" arrives next.
		cur, err := c.Get(ctx, "ranged", "Stats", client.Key{"h"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var last json.RawMessage
		var token string
		seen := 0
		for e, err := range c.Changes(sctx, "ranged", &client.ChangeOptions{Tables: []string{"Stats"}}) {
			if err != nil {
				t.Fatal(err)
			}
			if e.Type == "change" {
				seen++
				if fmt.Sprint(e.Source.Key...) == "h" {
					last = e.After
				}
			}
			if token = e.Token; seen == 4 {
				break
			}
		}
		wantJSON(t, last, string(cur.Body))
		if _, err := c.Put(ctx, "ranged", "Stats", client.Key{"h"}, map[string]any{"total": 7, "unread": 7}, nil); err != nil {
			t.Fatal(err)
		}
		for e, err := range c.Changes(sctx, "ranged", &client.ChangeOptions{Since: token}) {
			if err != nil {
				t.Fatal(err)
			}
			if e.Type == "change" {
				if e.Op != "u" || fmt.Sprint(e.Source.Key...) != "h" {
					t.Fatalf("after the token: %s", e.Raw)
				}
				break
			}
		}
		for _, err := range c.Changes(sctx, "nodb", nil) {
			wantErr(t, err, client.ErrNoDatabase)
			break
		}
	})
}
