package client

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"testing"
)

// backupFile builds a small valid backup: one table, two partitions.
func backupFile() []byte {
	var b bytes.Buffer
	b.WriteString(`{"type":"backup","format":1,"db":"d","created":"2026-11-30T00:00:00Z","database":{"name":"d","partitions":2}}` + "\n")
	b.WriteString(`{"type":"table","table":"T","key":[{"name":"k"}],"compatibility":"FULL","versions":[{"version":1,"schema":{"type":"record","name":"T","fields":[{"name":"v","type":"string"}]}}]}` + "\n")
	for p := range 2 {
		rows := fmt.Sprintf(`{"type":"row","table":"T","key":["k%d"],"version":1,"ts_ms":1,"avro":"AmE="}`+"\n", p)
		fmt.Fprintf(&b, `{"type":"partition","partition":%d,"scn":"1:1"}`+"\n", p)
		b.WriteString(rows)
		fmt.Fprintf(&b, `{"type":"partition_end","partition":%d,"rows":1,"marks":0,"crc32c":%d}`+"\n", p, crc32.Checksum([]byte(rows), castagnoli))
	}
	b.WriteString(`{"type":"end","partitions":2,"rows":2,"marks":0,"token":"x"}` + "\n")
	return b.Bytes()
}

// check reads a backup file as Restore does, before it writes anything.
func check(file []byte) (*backupChecker, error) {
	chk := &backupChecker{}
	sc := backupLines(bytes.NewReader(file))
	for sc.Scan() {
		if err := chk.line(sc.Bytes()); err != nil {
			return nil, err
		}
	}
	return chk, sc.Err()
}

func TestBackupChecker(t *testing.T) {
	file := backupFile()
	chk, err := check(file)
	if err != nil || chk.end == nil || len(chk.sections) != 2 {
		t.Fatalf("a valid backup: %v %+v", err, chk)
	}
	for _, s := range chk.sections {
		if got := string(file[s.start:s.end]); got != fmt.Sprintf(`{"type":"row","table":"T","key":["k%d"],"version":1,"ts_ms":1,"avro":"AmE="}`+"\n", s.partition) {
			t.Fatalf("section %d holds %q", s.partition, got)
		}
	}
	for name, f := range map[string][]byte{
		"a row changed":    bytes.Replace(file, []byte(`"AmE="`), []byte(`"AmI="`), 1),
		"a row dropped":    bytes.Replace(file, []byte(`{"type":"row","table":"T","key":["k0"],"version":1,"ts_ms":1,"avro":"AmE="}`+"\n"), nil, 1),
		"cut":              file[:bytes.LastIndex(file[:len(file)-1], []byte("\n"))+1],
		"not a backup":     file[bytes.IndexByte(file, '\n')+1:],
		"another format":   bytes.Replace(file, []byte(`"format":1`), []byte(`"format":2`), 1),
		"a line after end": append(bytes.Clone(file), file[:bytes.IndexByte(file, '\n')+1]...),
		"CRLF":             bytes.ReplaceAll(file, []byte("\n"), []byte("\r\n")),
	} {
		if chk, err := check(f); err == nil && chk.end != nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzBackupFile: whatever a backup file holds, reading it ends without
// a panic, and a file it accepts has its sections inside it.
func FuzzBackupFile(f *testing.F) {
	f.Add(backupFile())
	f.Add([]byte(`{"type":"backup","format":1}` + "\n" + `{"type":"end"}`))
	f.Add([]byte(`{"type":"partition_abort"}`))
	f.Fuzz(func(t *testing.T, file []byte) {
		chk, err := check(file)
		if err != nil || chk.end == nil {
			return
		}
		for _, s := range chk.sections {
			if s.start < 0 || s.end < s.start || s.end > int64(len(file)) {
				t.Fatalf("section %+v outside a file of %d bytes", s, len(file))
			}
			// What a restore sends of it: the section's row and mark
			// lines, and nothing else.
			n := 0
			for sc := backupLines(bytes.NewReader(file[s.start:s.end])); sc.Scan(); n++ {
				if typ := lineType(sc.Bytes()); typ != "row" && typ != "mark" {
					t.Fatalf("section %+v holds a %q line", s, typ)
				}
			}
			if n != s.rows+s.marks {
				t.Fatalf("section %+v holds %d lines", s, n)
			}
		}
	})
}
