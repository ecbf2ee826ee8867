package clustertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/cortado-db/cortado/client"
)

// demoClient is an HTTP client of a server in this process with the demo
// database.
func demoClient(t *testing.T) *client.Client {
	_, c := demoOverHTTP(t)
	return c
}

// demoOverHTTP serves a server's demo database over HTTP, with a client
// of it; both end with the test.
func demoOverHTTP(t *testing.T) (*httptest.Server, *client.Client) {
	s := openServer(t)
	if err := s.DemoDatabase(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	c := client.New(ts.URL)
	t.Cleanup(func() { c.Close() })
	return ts, c
}

// TestClientKeysRoundTrip: every key part the client is given names that
// key and no other — parts that are not plain path segments ("." and
// "..", "/", ",", parentheses, "%") are written, read, multi-read and
// deleted under themselves — and a part no URL can carry (an empty
// string) or an integer part that is not an integer is refused with
// nothing done, never sent as another key.
func TestClientKeysRoundTrip(t *testing.T) {
	c := demoClient(t)
	ctx := context.Background()

	type stats struct {
		Total int64 `json:"total"`
	}
	odd := []string{".", "..", "a/b", "(x)", "a,b", "%41", "ü", "a b", "?q=1", "#f"}
	var all []client.Key
	for i, k := range odd {
		key := client.Key{k}
		if _, err := c.Put(ctx, "demo", "MailboxStats", key, stats{Total: int64(i)}, nil); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
		var got stats
		d, err := c.Get(ctx, "demo", "MailboxStats", key, nil)
		if err != nil || d.Decode(&got) != nil || got.Total != int64(i) {
			t.Fatalf("get %q: %v %+v", k, err, got)
		}
		all = append(all, key)
	}
	p, err := c.MultiGet(ctx, "demo", "MailboxStats", all, nil)
	if err != nil || len(p.Documents) != len(odd) || len(p.Missing) != 0 {
		t.Fatalf("multi-get of %q: %v, %d documents, missing %v", odd, err, len(p.Documents), p.Missing)
	}
	for i, d := range p.Documents {
		var got stats
		if d.Decode(&got) != nil || d.Key[0] != odd[got.Total] {
			t.Fatalf("multi-get document %d: key %v holds %+v", i, d.Key, got)
		}
	}
	for _, k := range odd {
		if _, err := c.Delete(ctx, "demo", "MailboxStats", client.Key{k}, nil); err != nil {
			t.Fatalf("delete %q: %v", k, err)
		}
	}

	// A collection and a document beside the refused keys must survive.
	if _, err := c.Insert(ctx, "demo", "Message", client.Key{"box"}, map[string]any{"from": "a", "subject": "s"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "demo", "Profile", client.Key{4}, map[string]any{"firstName": map[string]string{}, "lastName": "L"}, nil); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"delete of an empty last part": func() error { _, err := c.Delete(ctx, "demo", "Message", client.Key{"box", ""}, nil); return err },
		"put of an empty key part":     func() error { _, err := c.Put(ctx, "demo", "MailboxStats", client.Key{""}, stats{}, nil); return err },
		"transaction on an empty key": func() error {
			_, err := c.Txn(ctx, "demo", "box", []client.TxnOp{{Op: "delete", Table: "Message", Key: client.Key{"box", ""}}})
			return err
		},
		"a fraction as an integer part": func() error { _, err := c.Delete(ctx, "demo", "Profile", client.Key{4.5}, nil); return err },
	} {
		var ce *client.Error
		if err := call(); !errors.As(err, &ce) || ce.Status != 400 {
			t.Fatalf("%s: %v, want a 400", name, err)
		}
	}
	// Parts of other types are refused before anything is sent (their
	// fmt form named the keys "<nil>" and "true").
	for _, part := range []any{nil, true, struct{}{}} {
		if _, err := c.Put(ctx, "demo", "MailboxStats", client.Key{part}, stats{}, nil); err == nil {
			t.Fatalf("put under the key part %#v: no error", part)
		}
		if _, err := c.Delete(ctx, "demo", "Message", client.Key{"box", part}, nil); err == nil {
			t.Fatalf("delete under the key part %#v: no error", part)
		}
	}
	for _, k := range []string{"<nil>", "true", "{}"} {
		if _, err := c.Get(ctx, "demo", "MailboxStats", client.Key{k}, nil); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("document %q after the refused puts: %v", k, err)
		}
	}
	if p, err := c.Collection(ctx, "demo", "Message", client.Key{"box"}, 10, "", nil); err != nil || len(p.Documents) != 1 {
		t.Fatalf("the collection after the refused requests: %v, %+v", err, p)
	}
	if _, err := c.Get(ctx, "demo", "Profile", client.Key{4.0}, nil); err != nil {
		t.Fatalf("Profile 4 after the refused requests, read with the key 4.0: %v", err)
	}
}

// TestAutoIncrementExhausted: an insert past the largest value of the
// auto-increment key part's type is refused (409) with nothing written.
// It wrapped a long to -9223372036854775808, and wrote an int key of
// 2147483648, which no path could name again (an int part must fit).
func TestAutoIncrementExhausted(t *testing.T) {
	c := demoClient(t)
	ctx := context.Background()
	if err := c.CreateDatabase(ctx, "ai", client.Database{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterSchema(ctx, "ai", "T", client.TableSchema{Key: []client.KeyPart{{Name: "box"}, {Name: "n", Type: "int", AutoIncrement: true}},
		Schema: json.RawMessage(`{"type":"record","name":"T","fields":[{"name":"v","type":"long"}]}`)}); err != nil {
		t.Fatal(err)
	}
	msg := map[string]any{"from": "a", "subject": "s"}
	for _, tc := range []struct {
		db, table string
		doc       any
		last      int64 // the largest value of the part's type
	}{
		{"demo", "Message", msg, math.MaxInt64},
		{"ai", "T", map[string]any{"v": 1}, math.MaxInt32},
	} {
		// One below the largest: the insert takes the largest.
		if _, err := c.Put(ctx, tc.db, tc.table, client.Key{"near", tc.last - 1}, tc.doc, nil); err != nil {
			t.Fatal(err)
		}
		w, err := c.Insert(ctx, tc.db, tc.table, client.Key{"near"}, tc.doc)
		if err != nil || fmt.Sprint(w.Key) != fmt.Sprint(client.Key{"near", tc.last}) {
			t.Fatalf("%s: the insert below the largest key: %v %v", tc.table, err, w)
		}
		for _, box := range []string{"near", "full"} {
			if box == "full" {
				if _, err := c.Put(ctx, tc.db, tc.table, client.Key{"full", tc.last}, tc.doc, nil); err != nil {
					t.Fatal(err)
				}
			}
			var ce *client.Error
			if _, err := c.Insert(ctx, tc.db, tc.table, client.Key{box}, tc.doc); !errors.As(err, &ce) || ce.Status != 409 {
				t.Fatalf("%s: an insert past the largest key in %s: %v, want a 409", tc.table, box, err)
			}
			p, err := c.Collection(ctx, tc.db, tc.table, client.Key{box}, 10, "", nil)
			if err != nil || len(p.Documents) != map[string]int{"near": 2, "full": 1}[box] {
				t.Fatalf("%s: collection %s after the refused insert: %v, %d documents", tc.table, box, err, len(p.Documents))
			}
		}
	}
}

// TestInsertNeverReusesADeletedKey: an insert never hands out a key a
// deleted document had, whether an insert or a put made it: after a put
// of ["bob",5] and its delete, the next insert is 6 (it was 1, then 2 …
// then 5 again); after a collection's delete (in one transaction with
// puts of its own keys, and on its own), the next insert is above its
// largest key; in a transaction, an insert after the delete of a key
// put before it in that transaction takes the next one.
func TestInsertNeverReusesADeletedKey(t *testing.T) {
	c := demoClient(t)
	ctx := context.Background()
	msg := map[string]any{"from": "a", "subject": "s"}
	insert := func(box string) int64 {
		t.Helper()
		w, err := c.Insert(ctx, "demo", "Message", client.Key{box}, msg)
		if err != nil {
			t.Fatal(err)
		}
		return w.Key[1].(int64)
	}
	if _, err := c.Put(ctx, "demo", "Message", client.Key{"bob", 5}, msg, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, "demo", "Message", client.Key{"bob", 5}, nil); err != nil {
		t.Fatal(err)
	}
	if n := insert("bob"); n != 6 {
		t.Fatalf("the insert after a put of 5 and its delete took %d, want 6", n)
	}
	for _, k := range []int64{7, 9} {
		if _, err := c.Put(ctx, "demo", "Message", client.Key{"carol", k}, msg, nil); err != nil {
			t.Fatal(err)
		}
	}
	if w, err := c.Delete(ctx, "demo", "Message", client.Key{"carol"}, nil); err != nil || w.Deleted != 2 {
		t.Fatalf("the collection's delete: %v %+v", err, w)
	}
	if n := insert("carol"); n != 10 {
		t.Fatalf("the insert after the collection's delete took %d, want 10", n)
	}
	res, err := c.Txn(ctx, "demo", "dave", []client.TxnOp{
		{Op: "put", Table: "Message", Key: client.Key{"dave", 1}, Document: msg},
		{Op: "delete", Table: "Message", Key: client.Key{"dave", 1}},
		{Op: "insert", Table: "Message", Key: client.Key{"dave"}, Document: msg},
	})
	if err != nil || fmt.Sprint(res.Results[2].Key) != fmt.Sprint(client.Key{"dave", 2}) {
		t.Fatalf("the insert after a put and delete of 1 in its transaction: %v %+v", err, res)
	}
}

// TestPatchMapKeysWithDots: a patch names a map key holding a dot (or a
// backslash) by escaping it, as client.PatchPath writes it, and every
// patch operation finds that key; an escape of anything else is 400 and
// changes nothing.
func TestPatchMapKeysWithDots(t *testing.T) {
	c := demoClient(t)
	ctx := context.Background()
	if _, err := c.Put(ctx, "demo", "Profile", client.Key{7}, map[string]any{"firstName": map[string]any{"en": "Ann", "a.b": "x"}, "lastName": "L"}, nil); err != nil {
		t.Fatal(err)
	}
	if got := client.PatchPath("firstName", "en.US", `a\b`); got != `firstName.en\.US.a\\b` {
		t.Fatalf("PatchPath: %s", got)
	}
	if _, err := c.Patch(ctx, "demo", "Profile", client.Key{7}, client.Patch{
		Set:    map[string]any{client.PatchPath("firstName", "en.US"): "Annie", client.PatchPath("firstName", `c\d`): "y"},
		Remove: []string{client.PatchPath("firstName", "a.b")},
	}, nil); err != nil {
		t.Fatal(err)
	}
	read := func() map[string]string {
		d, err := c.Get(ctx, "demo", "Profile", client.Key{7}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ FirstName map[string]string }
		d.Decode(&v)
		return v.FirstName
	}
	want := map[string]string{"en": "Ann", "en.US": "Annie", `c\d`: "y"}
	if got := read(); !maps.Equal(got, want) {
		t.Fatalf("after the patch: %v, want %v", got, want)
	}
	var ce *client.Error
	if _, err := c.Patch(ctx, "demo", "Profile", client.Key{7}, client.Patch{Set: map[string]any{`firstName.a\b`: "z"}}, nil); !errors.As(err, &ce) || ce.Status != 400 {
		t.Fatalf("an escape of a letter: %v, want 400", err)
	}
	if got := read(); !maps.Equal(got, want) {
		t.Fatalf("after the refused patch: %v, want %v", got, want)
	}
}
