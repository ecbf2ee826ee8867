package clustertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cortado-db/cortado/client"
	"github.com/cortado-db/cortado/client/embedded"
)

// backupDB builds database src: table Message (a mailbox, an
// auto-increment id; version 1, then a version 2 adding a field, under
// BACKWARD) with documents of both versions and deleted keys past the
// largest kept one, and table Counter (a long key) that writers change
// while a backup runs.
func backupDB(t *testing.T, ctx context.Context, c *client.Client) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.CreateDatabase(ctx, "src", client.Database{Partitions: 8}))
	_, err := c.RegisterSchema(ctx, "src", "Message", client.TableSchema{
		Key:    []client.KeyPart{{Name: "box"}, {Name: "id", Type: "long", AutoIncrement: true}},
		Schema: json.RawMessage(`{"type":"record","name":"Message","fields":[{"name":"subject","type":"string","index":"text"}]}`),
	})
	must(err)
	_, err = c.RegisterSchema(ctx, "src", "Counter", client.TableSchema{
		Key:    []client.KeyPart{{Name: "k", Type: "long"}},
		Schema: json.RawMessage(`{"type":"record","name":"Counter","fields":[{"name":"n","type":"long"}]}`),
	})
	must(err)
	for _, box := range []string{"alice", "bob", "ćwierć"} {
		for i := range 6 {
			_, err := c.Insert(ctx, "src", "Message", client.Key{box}, map[string]any{"subject": fmt.Sprintf("hello %s %d", box, i)})
			must(err)
		}
	}
	// Keys 5 and 6 of alice deleted: her mark (6) is past her largest key.
	for _, id := range []int64{5, 6} {
		_, err := c.Delete(ctx, "src", "Message", client.Key{"alice", id}, nil)
		must(err)
	}
	must(c.SetCompatibility(ctx, "src", "Message", "BACKWARD"))
	v, err := c.RegisterSchema(ctx, "src", "Message", client.TableSchema{
		Schema: json.RawMessage(`{"type":"record","name":"Message","fields":[{"name":"subject","type":"string","index":"text"},{"name":"read","type":"boolean","default":false}]}`),
	})
	must(err)
	if v != 2 {
		t.Fatalf("version %d", v)
	}
	_, err = c.Put(ctx, "src", "Message", client.Key{"bob", int64(2)}, map[string]any{"subject": "rewritten in version 2", "read": true}, nil)
	must(err)
	for k := range 100 {
		_, err := c.Put(ctx, "src", "Counter", client.Key{int64(k)}, map[string]any{"n": 0}, nil)
		must(err)
	}
	// A document of 1.5 MB: its row line is 2 MB of base64.
	_, err = c.RegisterSchema(ctx, "src", "Blob", client.TableSchema{
		Key:    []client.KeyPart{{Name: "k"}},
		Schema: json.RawMessage(`{"type":"record","name":"Blob","fields":[{"name":"data","type":"string"}]}`),
	})
	must(err)
	_, err = c.Put(ctx, "src", "Blob", client.Key{"big"}, map[string]any{"data": strings.Repeat("0123456789abcdef", 1<<20*3/32)}, nil)
	must(err)
}

// readAll reads every document of src's universe of keys from db: key →
// JSON body.
func readAll(t *testing.T, ctx context.Context, c *client.Client, db string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, box := range []string{"alice", "bob", "ćwierć"} {
		p, err := c.Collection(ctx, db, "Message", client.Key{box}, 1000, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.Documents {
			out[fmt.Sprintf("Message/%v/%v", d.Key[0], d.Key[1])] = string(d.Body)
		}
	}
	if d, err := c.Get(ctx, db, "Blob", client.Key{"big"}, nil); err == nil {
		out["Blob/big"] = string(d.Body)
	} else if !errors.Is(err, client.ErrNotFound) {
		t.Fatal(err)
	}
	for k := range 100 {
		d, err := c.Get(ctx, db, "Counter", client.Key{int64(k)}, nil)
		if errors.Is(err, client.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprintf("Counter/%d", k)] = string(d.Body)
	}
	return out
}

// TestBackupRestore backs a database up while writers change it, restores
// the backup into a new database, and checks, against the source rather
// than the backup alone: the restored database plus the change stream
// from the backup's token is the source's final state (each partition's
// section is consistent at the SCN its token names, and nothing is
// missing or extra); documents keep the schema version they were written
// in; the auto-increment marks carry over (an insert gets the key the
// source would give, not a deleted one); the text index answers; a
// damaged or cut backup is refused before anything is created; and a
// restore sent again into the database it made leaves it the same.
func TestBackupRestore(t *testing.T) {
	ctx := context.Background()
	c, err := embedded.Open(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	backupDB(t, ctx, c)

	// Writers change counters and delete some while the backup runs.
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	acked := map[int]int{} // counter → the last value acknowledged
	var mu sync.Mutex
	for w := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for n := 1; wctx.Err() == nil; n++ {
				k := rng.IntN(50)*2 + w // a key has one writer: its acknowledgements are in commit order
				if rng.IntN(10) == 0 {
					if _, err := c.Delete(wctx, "src", "Counter", client.Key{int64(k)}, nil); err == nil || errors.Is(err, client.ErrNotFound) {
						mu.Lock()
						acked[k] = -1
						mu.Unlock()
					}
					continue
				}
				v := n*10 + w
				if _, err := c.Put(wctx, "src", "Counter", client.Key{int64(k)}, map[string]any{"n": v}, nil); err == nil {
					mu.Lock()
					acked[k] = v
					mu.Unlock()
				}
			}
		})
	}
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 50 {
			break
		}
		runtime.Gosched()
	}
	var buf bytes.Buffer
	sum, err := c.Backup(ctx, "src", &buf, nil)
	stopWriters()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if sum.Partitions != 8 || sum.Marks != 3 || sum.Rows < 16 {
		t.Fatalf("backup summary %+v", sum)
	}
	want := readAll(t, ctx, c, "src")
	for k, v := range acked { // the source itself holds what was acknowledged
		got, ok := want[fmt.Sprintf("Counter/%d", k)]
		if v < 0 && ok || v >= 0 && got != fmt.Sprintf(`{"n":%d}`, v) {
			t.Fatalf("source: counter %d is %q, acknowledged %d", k, got, v)
		}
	}

	backup := buf.Bytes()
	var last client.RestoreProgress
	res, err := c.Restore(ctx, inMemory(backup), &client.RestoreOptions{As: "dst", Progress: func(p client.RestoreProgress) { last = p }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != sum.Rows || res.Marks != 3 || res.Partitions != 8 {
		t.Fatalf("restore summary %+v, backup %+v", res, sum)
	}
	if last.PartitionsDone != 8 || last.Partitions != 8 || last.Rows != sum.Rows {
		t.Fatalf("the restore's last progress %+v", last)
	}

	// The restored database and the changes after the token add up to
	// the source.
	got := readAll(t, ctx, c, "dst")
	applied := 0
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for e, err := range c.Changes(sctx, "src", &client.ChangeOptions{Since: sum.Token}) {
		if err != nil {
			t.Fatalf("the change stream after the backup: %v (restored plus changes: %d documents, the source %d)", err, len(got), len(want))
		}
		if e.Type != "change" {
			continue
		}
		k := fmt.Sprintf("%s/%v", e.Source.Table, e.Source.Key[0])
		if len(e.Source.Key) == 2 {
			k += fmt.Sprintf("/%v", e.Source.Key[1])
		}
		if e.Op == "d" {
			delete(got, k)
		} else {
			got[k] = string(e.After)
		}
		applied++
		if maps.Equal(got, want) {
			break
		}
	}
	if !maps.Equal(got, want) {
		t.Fatal("the restored database plus the changes after the backup's token is not the source")
	}
	t.Logf("backup: %+v; %d changes after its token", *sum, applied)

	// Documents are as written: version 1 where the source wrote 1, the
	// same bytes (and CRC).
	for _, k := range []client.Key{{"alice", int64(1)}, {"bob", int64(2)}} {
		a, err := c.GetAvro(ctx, "src", "Message", k, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.GetAvro(ctx, "dst", "Message", k, nil)
		if err != nil {
			t.Fatal(err)
		}
		if a.SchemaVersion != b.SchemaVersion || !bytes.Equal(a.Body, b.Body) || tagCRC(a.ETag) != tagCRC(b.ETag) {
			t.Fatalf("%v: source version %d %x %s, restored %d %x %s", k, a.SchemaVersion, a.Body, a.ETag, b.SchemaVersion, b.Body, b.ETag)
		}
	}
	info, err := c.Table(ctx, "dst", "Message")
	if err != nil {
		t.Fatal(err)
	}
	if info.Latest != 2 || info.Compatibility != "BACKWARD" {
		t.Fatalf("restored table %+v", info)
	}
	// Marks: both databases hand out the same next key (7, past the
	// deleted 6), never a deleted one.
	for _, db := range []string{"src", "dst"} {
		w, err := c.Insert(ctx, db, "Message", client.Key{"alice"}, map[string]any{"subject": "after"})
		if err != nil {
			t.Fatal(err)
		}
		if w.Key[1] != int64(7) {
			t.Fatalf("%s: an insert got key %v, want 7", db, w.Key)
		}
	}
	// The text index answers in the restored database.
	p, err := c.Query(ctx, "dst", "Message", client.Key{"bob"}, client.Query{Where: `subject:rewritten`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Documents) != 1 || p.Documents[0].Key[1] != int64(2) {
		t.Fatalf("query in the restored database: %+v", p.Documents)
	}

	// A restore into an existing database is refused without Existing,
	// and with it writes the same documents again.
	if _, err := c.Restore(ctx, inMemory(backup), &client.RestoreOptions{As: "dst"}); err == nil {
		t.Fatal("a restore into an existing database was not refused")
	}
	before := readAll(t, ctx, c, "dst")
	if _, err := c.Restore(ctx, inMemory(backup), &client.RestoreOptions{As: "dst", Existing: true}); err != nil {
		t.Fatal(err)
	}
	after := readAll(t, ctx, c, "dst")
	// The insert after the first restore is not in the backup: it stays.
	if !maps.Equal(before, after) {
		t.Fatal("a second restore into the database changed it")
	}

	// A section the server abandoned midway (its snapshot failed, and
	// was taken again) counts for nothing: here a copy of a partition's
	// first row, under a section of the same partition that aborted.
	start := bytes.Index(backup, []byte(`{"type":"row"`))
	open := bytes.LastIndex(backup[:start], []byte(`{"type":"partition"`))
	var part struct{ Partition int }
	json.Unmarshal(backup[open:start], &part)
	aborted := slices.Concat(backup[:open], backup[open:start], []byte(`{"type":"row","table":"Counter","key":[1000],"version":1,"ts_ms":1,"avro":"AA=="}`+"\n"),
		fmt.Appendf(nil, `{"type":"partition_abort","partition":%d,"reason":"a failover"}`+"\n", part.Partition), backup[open:])
	if _, err := c.Restore(ctx, inMemory(aborted), &client.RestoreOptions{As: "aborted"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "aborted", "Counter", client.Key{int64(1000)}, nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a row of an aborted section was restored: %v", err)
	}
	if got := readAll(t, ctx, c, "aborted"); len(got) != sum.Rows {
		t.Fatalf("restored %d documents from a backup with an aborted section, want %d", len(got), sum.Rows)
	}

	// A range-partitioned database comes back with its boundaries: each
	// document in the partition its key falls in.
	if err := c.CreateDatabase(ctx, "ranged", client.Database{Partitioning: "range", Boundaries: []any{"h", "p"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterSchema(ctx, "ranged", "T", client.TableSchema{Key: []client.KeyPart{{Name: "k"}},
		Schema: json.RawMessage(`{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}`)}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"apple", "kiwi", "zucchini"} {
		if _, err := c.Put(ctx, "ranged", "T", client.Key{k}, map[string]any{"v": k}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var ranged bytes.Buffer
	if _, err := c.Backup(ctx, "ranged", &ranged, &client.BackupOptions{Partitions: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(ranged.Bytes(), []byte(`"boundaries":["h","p"]`)) || !bytes.Contains(ranged.Bytes(), []byte(`"key":["kiwi"]`)) || bytes.Contains(ranged.Bytes(), []byte(`"apple"`)) {
		t.Fatalf("a backup of partition 1 of a range-partitioned database:\n%s", ranged.Bytes())
	}
	if _, err := c.Restore(ctx, inMemory(ranged.Bytes()), &client.RestoreOptions{As: "ranged2"}); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Get(ctx, "ranged2", "T", client.Key{"kiwi"}, nil); err != nil || string(d.Body) != `{"v":"kiwi"}` {
		t.Fatalf("restored kiwi: %v %v", d, err)
	}
	if _, err := c.Get(ctx, "ranged2", "T", client.Key{"apple"}, nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("apple, not in the partition backed up, was restored: %v", err)
	}
	var again bytes.Buffer
	if _, err := c.Backup(ctx, "ranged2", &again, &client.BackupOptions{Partitions: []int{1}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(again.Bytes(), []byte(`"partitioning":"range","partitions":3,"boundaries":["h","p"]`)) || !bytes.Contains(again.Bytes(), []byte(`"key":["kiwi"]`)) {
		t.Fatalf("the restored range-partitioned database:\n%s", again.Bytes())
	}

	// A backup that changes between the check and the writing (cut
	// short, here) fails the restore instead of restoring part of it.
	calls := 0
	changing := func() (io.ReadCloser, error) {
		calls++
		if calls == 1 {
			return io.NopCloser(bytes.NewReader(backup)), nil
		}
		return io.NopCloser(bytes.NewReader(backup[:len(backup)/2])), nil
	}
	if _, err := c.Restore(ctx, changing, &client.RestoreOptions{As: "changing"}); err == nil || !strings.Contains(err.Error(), "changed while it was restored") {
		t.Fatalf("a backup cut short while restored: %v", err)
	}

	// Damaged and cut backups are refused before anything is created.
	i := bytes.Index(backup, []byte(`{"type":"row"`))
	j := bytes.Index(backup[i:], []byte(`"avro":"`)) + i + len(`"avro":"`)
	damaged := bytes.Clone(backup)
	if damaged[j] == 'A' {
		damaged[j] = 'B'
	} else {
		damaged[j] = 'A'
	}
	cut := backup[:bytes.LastIndex(backup[:len(backup)-1], []byte("\n"))+1]
	for name, b := range map[string][]byte{"damaged": damaged, "cut": cut} {
		_, err := c.Restore(ctx, inMemory(b), &client.RestoreOptions{As: name})
		if err == nil {
			t.Fatalf("a %s backup was restored", name)
		}
		if _, err := c.Table(ctx, name, "Message"); !errors.Is(err, client.ErrNoDatabase) {
			t.Fatalf("a %s backup created database %s: %v", name, name, err)
		}
	}
}

// TestRestoreBodyChecked sends restore bodies to a `cortado serve`: one
// bad line among good ones writes nothing and names the line; the
// answers are problems with their documented types.
func TestRestoreBodyChecked(t *testing.T) {
	s := StartServe(t, ServeOptions{Args: []string{"--demo"}})
	h := httpCase{t, s.URL}
	good := `{"type":"row","table":"Profile","key":[7],"version":1,"ts_ms":1,"avro":"AAJMAAA="}` + "\n"
	ndjson := map[string]string{"Content-Type": "application/x-ndjson"}
	for _, tc := range []struct {
		name, body, ctype string
		status            int
		typ               string
	}{
		{"bad avro after a good line", good + `{"type":"row","table":"Profile","key":[8],"version":1,"avro":"/w=="}` + "\n", "", 400, "invalid-document"},
		{"unknown version", good + `{"type":"row","table":"Profile","key":[8],"version":9,"avro":"AAJMAAA="}`, "", 404, "no-such-schema-version"},
		{"a key of the wrong type", good + `{"type":"row","table":"Profile","key":["x"],"version":1,"avro":"AAJMAAA="}`, "", 400, "invalid-key"},
		{"a mark of a table without auto-increment", good + `{"type":"mark","table":"Profile","key":[8]}`, "", 400, "malformed-request"},
		{"a header line", `{"type":"backup","format":1}`, "", 400, "malformed-request"},
		{"an unknown table", `{"type":"row","table":"Nope","key":[8],"version":1,"avro":"AA=="}`, "", 404, "no-such-table"},
		{"JSON instead of NDJSON", good, "application/json", 415, "unsupported-media-type"},
	} {
		hdr := ndjson
		if tc.ctype != "" {
			hdr = map[string]string{"Content-Type": tc.ctype}
		}
		r := h.do("POST", "/demo/_restore", hdr, tc.body)
		h.problem(r, tc.status, "urn:cortado:problem:"+tc.typ)
		h.want(h.do("GET", "/demo/Profile/7", nil, ""), 404)
	}
	r := h.do("POST", "/demo/_restore", ndjson, good)
	h.want(r, 200)
	wantJSON(t, r.body, `{"commits":1,"marks":0,"rows":1}`)
	r = h.do("GET", "/demo/Profile/7", nil, "")
	h.want(r, 200)
	wantJSON(t, r.body, `{"firstName":{},"lastName":"L","headline":null,"positions":{}}`)
	// A document whose map entries are out of order is stored as a PUT
	// of it stores it: entries sorted, the same bytes (and CRC, in the
	// entity tag) as the same document sent as JSON.
	unsorted := `{"type":"row","table":"Profile","key":[9],"version":1,"avro":"BAJiAngCYQJ5AAJMAAA="}`
	h.want(h.do("POST", "/demo/_restore", ndjson, unsorted), 200)
	h.want(h.do("PUT", "/demo/Profile/10", nil, `{"firstName":{"b":"x","a":"y"},"lastName":"L"}`), 201)
	a, b := h.want(h.do("GET", "/demo/Profile/9", nil, ""), 200), h.want(h.do("GET", "/demo/Profile/10", nil, ""), 200)
	if tagCRC(a.header.Get("ETag")) != tagCRC(b.header.Get("ETag")) || string(a.body) != string(b.body) {
		t.Fatalf("restored with its map out of order: %s %s; sent as JSON: %s %s", a.header.Get("ETag"), a.body, b.header.Get("ETag"), b.body)
	}
	h.problem(h.do("GET", "/nodb/_backup", nil, ""), 404, "urn:cortado:problem:no-such-database")
	h.problem(h.do("GET", "/demo/_backup?partitions=64", nil, ""), 400, "urn:cortado:problem:malformed-request")
	r = h.want(h.do("GET", "/demo/_backup", nil, ""), 200)
	if !bytes.Contains(r.body, []byte(`{"type":"row","table":"Profile","key":[7],"version":1,`)) || !bytes.Contains(r.body, []byte(`{"type":"end","partitions":64,"rows":3,"marks":0,`)) {
		t.Fatalf("backup of the demo database:\n%s", r.body)
	}
}

// inMemory opens a backup held in memory, for client.Restore.
func inMemory(b []byte) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// rowSet is a backup's rows without their times: table, key, schema
// version and Avro of each.
func rowSet(t *testing.T, b []byte) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for line := range bytes.Lines(b) {
		var r struct {
			Type, Table string
			Key         []any
			Version     int
			Avro        []byte
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Fatal(err)
		}
		if r.Type == "row" {
			out[fmt.Sprintf("%s %v %d %x", r.Table, r.Key, r.Version, r.Avro)] = true
		}
	}
	return out
}

// TestRestoreUnderFailover restores a backup of a three-node cluster's
// database into a new one while the storage node mastering most
// partitions is killed (-9) after the first restore request: the client
// sends the failed requests again, every document of the backup reads
// back, the replicas agree (consistency check, the killed node back),
// and a backup of the restored database holds the same documents.
func TestRestoreUnderFailover(t *testing.T) {
	c := startProcCluster(t, 3, 16)
	ctx := context.Background()
	cl := client.New(c.router.URL)
	defer cl.Close()
	const docs = 4000
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				if status, body := c.put(fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i), "10s"); status >= 300 {
					t.Errorf("put k%d: %d %s", i, status, body)
				}
			}
		})
	}
	for i := range docs {
		work <- i
	}
	close(work)
	wg.Wait()
	// An auto-increment table whose largest key was deleted: its mark
	// crosses the wire to the new masters as a keepMark operation.
	c.do("PUT", "/_schemata/d/M", `{"key":[{"name":"g"},{"name":"id","type":"long","autoIncrement":true}],"schema":{"type":"record","name":"M","fields":[{"name":"v","type":"string"}]}}`, 201)
	for range 3 {
		c.do("POST", "/d/M/g", `{"v":"x"}`, 201)
	}
	c.do("DELETE", "/d/M/g/3", "", 204)
	var src bytes.Buffer
	sum, err := cl.Backup(ctx, "d", &src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Rows != docs+2 || sum.Marks != 1 {
		t.Fatalf("backup holds %d documents and %d marks, want %d and 1", sum.Rows, sum.Marks, docs+2)
	}

	victim := c.busiestMaster()
	var kill sync.Once
	res, err := cl.Restore(ctx, inMemory(src.Bytes()), &client.RestoreOptions{As: "r", Parallel: 2,
		Progress: func(client.RestoreProgress) { kill.Do(c.storage[victim].Kill) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != docs+2 || res.Retries == 0 {
		t.Fatalf("restore %+v: want %d documents, and requests sent again after the kill", res, docs+2)
	}
	t.Logf("restore under failover: %+v", *res)
	for i := range docs {
		await(t, 30*time.Second, "a restored document", func() bool {
			d, err := cl.Get(ctx, "r", "T", client.Key{fmt.Sprintf("k%d", i)}, nil)
			if errors.Is(err, client.ErrUnavailable) {
				return false
			}
			if err != nil || string(d.Body) != fmt.Sprintf(`{"v":"v%d"}`, i) {
				t.Fatalf("restored k%d: %v %v", i, d, err)
			}
			return true
		})
	}
	await(t, 30*time.Second, "an insert into the restored auto-increment table", func() bool {
		w, err := cl.Insert(ctx, "r", "M", client.Key{"g"}, map[string]any{"v": "after"})
		if errors.Is(err, client.ErrUnavailable) {
			return false
		}
		if err != nil || w.Key[1] != int64(4) {
			t.Fatalf("an insert after the restore: %v %v, want key 4 (3 was handed out, then deleted)", w, err)
		}
		return true
	})
	c.storage[victim].Restart()
	c.awaitHosting(victim)
	await(t, 60*time.Second, "the restored database's replicas to agree", func() bool {
		status, check := request(t, "POST", c.router.URL+"/_cluster/check?db=r", "")
		parts, _ := check["partitions"].([]any)
		if status != 200 || len(parts) != 16 {
			return false
		}
		for _, p := range parts {
			replicas, _ := p.(map[string]any)["replicas"].([]any)
			if len(replicas) != 2 {
				return false
			}
			for _, r := range replicas {
				if r.(map[string]any)["result"] != "equal" {
					return false
				}
			}
		}
		return true
	})
	var dst bytes.Buffer
	if _, err := cl.Backup(ctx, "r", &dst, nil); err != nil {
		t.Fatal(err)
	}
	a, b := rowSet(t, src.Bytes()), rowSet(t, dst.Bytes())
	delete(b, `M [g 4] 1 0a6166746572`) // the insert after the restore
	if !maps.Equal(a, b) {
		t.Fatalf("the restored database's backup holds %d documents, the source's %d, not the same", len(b), len(a))
	}
}

// killOnPartition is a backup's destination that kills a process when
// the backup opens the section of a partition that process masters.
type killOnPartition struct {
	bytes.Buffer
	masters map[int]string // partition → its master
	victim  *Serve
	id      string
	killed  int // the partition whose section was open, -1 before
}

// Write looks at the lines written whole so far (the client writes
// through a buffer: a write holds many lines, and may end inside one).
func (k *killOnPartition) Write(p []byte) (int, error) {
	start := k.Len()
	if i := bytes.LastIndexByte(k.Bytes(), '\n'); i >= 0 {
		start = i + 1
	}
	n, err := k.Buffer.Write(p)
	for line := range bytes.Lines(k.Bytes()[start:]) {
		var l struct {
			Type      string
			Partition int
		}
		if k.killed < 0 && bytes.HasPrefix(line, []byte(`{"type":"partition",`)) && json.Unmarshal(line, &l) == nil && k.masters[l.Partition] == k.id {
			k.victim.Kill()
			k.killed = l.Partition
		}
	}
	return n, err
}

// TestBackupUnderFailover backs up a three-node cluster's database whose
// snapshots stream slowly (1 MiB/s, partitions of more than a chunk)
// and kills (-9) the master of a partition while its section is being
// written: the section is marked aborted and taken again from the new
// master, and the backup, restored (with two replicas, on the two nodes
// left), holds every document.
func TestBackupUnderFailover(t *testing.T) {
	slow := []string{"--snapshot-rate", "1048576"}
	c := startProcClusterWith(t, 3, 4, map[string][]string{"s0": slow, "s1": slow, "s2": slow})
	ctx := context.Background()
	cl := client.New(c.router.URL)
	defer cl.Close()
	const docs = 1400 // about 1.4 MB a partition: two snapshot chunks
	payload := strings.Repeat("x", 4000)
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range work {
				if status, body := c.put(fmt.Sprintf("k%d", i), fmt.Sprintf("%d%s", i, payload), "10s"); status >= 300 {
					t.Errorf("put k%d: %d %s", i, status, body)
				}
			}
		})
	}
	for i := range docs {
		work <- i
	}
	close(work)
	wg.Wait()
	rt := c.table()
	masters := map[int]string{}
	for p := range rt.Partitions {
		masters[p], _ = rt.Master(p)
	}
	victim := busiestMaster(rt)
	dst := &killOnPartition{masters: map[int]string{}, victim: c.storage[victim], id: victim, killed: -1}
	for p, id := range masters {
		if id == victim {
			dst.masters[p] = victim
		}
	}
	sum, err := cl.Backup(ctx, "d", dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	if dst.killed < 0 || sum.Rows != docs {
		t.Fatalf("backup %+v, killed during partition %d", sum, dst.killed)
	}
	if !bytes.Contains(dst.Bytes(), fmt.Appendf(nil, `{"type":"partition_abort","partition":%d,`, dst.killed)) {
		t.Fatalf("no aborted section of partition %d", dst.killed)
	}
	t.Logf("backup under failover: %d partitions, %d documents; %s killed in partition %d's section", sum.Partitions, sum.Rows, victim, dst.killed)
	// Two nodes are left: restored with two replicas.
	b := dst.Bytes()
	if _, err := cl.Restore(ctx, inMemory(b), &client.RestoreOptions{As: "r", Replicas: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range docs {
		await(t, 30*time.Second, "a restored document", func() bool {
			d, err := cl.Get(ctx, "r", "T", client.Key{fmt.Sprintf("k%d", i)}, nil)
			if errors.Is(err, client.ErrUnavailable) {
				return false
			}
			if err != nil || string(d.Body) != fmt.Sprintf(`{"v":"%d%s"}`, i, payload) {
				t.Fatalf("restored k%d: %v", i, err)
			}
			return true
		})
	}
}
