package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cortado-db/cortado/client"
)

// common are the flags of every client command.
type common struct {
	url     *string
	timeout *time.Duration
}

func commonFlags(fs *flag.FlagSet) common {
	def := os.Getenv("CORTADO_URL")
	if def == "" {
		def = "http://127.0.0.1:8080"
	}
	return common{
		url:     fs.String("url", def, "router URL (or $CORTADO_URL)"),
		timeout: fs.Duration("timeout", 10*time.Second, "request deadline"),
	}
}

func (c common) client() (*client.Client, context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), *c.timeout)
	return client.New(*c.url), ctx, cancel
}

// parseArgs parses flags wherever they stand, before or after the path
// (`cortado get shop/Order/42 --fields qty`); "--" ends the flags.
func parseArgs(fs *flag.FlagSet, args []string) {
	var positional []string
	for {
		fs.Parse(args)
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	fs.Parse(append([]string{"--"}, positional...))
}

// parsePath splits "db/table/k1/k2" into its parts.
func parsePath(fs *flag.FlagSet, minParts int) (db, table string, key client.Key, err error) {
	if fs.NArg() != 1 {
		return "", "", nil, fmt.Errorf("want one path argument db/table[/key…]")
	}
	// Empty parts are refused, never dropped: `delete "demo/Message/$box/$id"`
	// with $id empty names a document, and trimmed to demo/Message/box it
	// would delete the collection.
	parts := strings.Split(strings.TrimPrefix(fs.Arg(0), "/"), "/")
	if slices.Contains(parts, "") {
		return "", "", nil, fmt.Errorf("path %q has an empty part (a doubled or trailing \"/\", or an empty variable): key parts may not be empty", fs.Arg(0))
	}
	if len(parts) < minParts {
		return "", "", nil, fmt.Errorf("path %q needs at least %d parts", fs.Arg(0), minParts)
	}
	db = parts[0]
	if len(parts) > 1 {
		table = parts[1]
	}
	for _, k := range parts[2:] {
		key = append(key, k)
	}
	return db, table, key, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printRaw(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		_, err := os.Stdout.Write(append(b, '\n'))
		return err
	}
	return printJSON(json.RawMessage(b))
}

func bodyArg(data string) ([]byte, error) {
	if data == "" || data == "-" {
		return io.ReadAll(os.Stdin)
	}
	if strings.HasPrefix(data, "@") {
		return os.ReadFile(data[1:])
	}
	return []byte(data), nil
}

func fieldsOf(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func runGet(args []string) error {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	c := commonFlags(fs)
	fields := fs.String("fields", "", "comma-separated dot paths to project")
	limit := fs.Int("limit", 0, "page size for collections")
	next := fs.String("next", "", "continuation token for collections")
	parseArgs(fs, args)
	db, table, key, err := parsePath(fs, 3)
	if err != nil {
		return err
	}
	cl, ctx, cancel := c.client()
	defer cancel()
	o := &client.ReadOptions{Fields: fieldsOf(*fields)}
	// A path ending in (a,b,c) is a multi-get.
	if last, ok := key[len(key)-1].(string); ok && strings.HasPrefix(last, "(") && strings.HasSuffix(last, ")") {
		var keys []client.Key
		for _, k := range strings.Split(last[1:len(last)-1], ",") {
			keys = append(keys, append(append(client.Key{}, key[:len(key)-1]...), k))
		}
		p, err := cl.MultiGet(ctx, db, table, keys, o)
		if err != nil {
			return err
		}
		return printPage(p)
	}
	tbl, err := cl.Table(ctx, db, table)
	if err != nil {
		return err
	}
	if len(key) < len(tbl.Key) {
		p, err := cl.Collection(ctx, db, table, key, *limit, *next, o)
		if err != nil {
			return err
		}
		return printPage(p)
	}
	d, err := cl.Get(ctx, db, table, key, o)
	if err != nil {
		return err
	}
	return printRaw(d.Body)
}

func printPage(p *client.Page) error {
	out := map[string]any{"documents": p.Documents}
	docs := make([]map[string]any, len(p.Documents))
	for i, d := range p.Documents {
		docs[i] = map[string]any{"key": d.Key, "scn": d.SCN, "etag": d.ETag, "document": d.Body}
	}
	out["documents"] = docs
	if len(p.Missing) > 0 {
		out["missing"] = p.Missing
	}
	if p.Next != "" {
		out["next"] = p.Next
	}
	return printJSON(out)
}

func writeCmd(name string, args []string, do func(ctx context.Context, cl *client.Client, db, table string, key client.Key, body []byte, cond *client.Conditions) (*client.WriteResult, error)) error {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	c := commonFlags(fs)
	data := fs.String("d", "", "request body: JSON, @file, or - for stdin (default stdin)")
	ifMatch := fs.String("if-match", "", "only if the document's ETag matches (compare-and-swap)")
	parseArgs(fs, args)
	db, table, key, err := parsePath(fs, 3)
	if err != nil {
		return err
	}
	var body []byte
	if name != "delete" {
		if body, err = bodyArg(*data); err != nil {
			return err
		}
	}
	cl, ctx, cancel := c.client()
	defer cancel()
	var cond *client.Conditions
	if *ifMatch != "" {
		cond = &client.Conditions{IfMatch: *ifMatch}
	}
	res, err := do(ctx, cl, db, table, key, body, cond)
	if err != nil {
		return err
	}
	return printJSON(res)
}

func runPut(args []string) error {
	return writeCmd("put", args, func(ctx context.Context, cl *client.Client, db, table string, key client.Key, body []byte, cond *client.Conditions) (*client.WriteResult, error) {
		return cl.Put(ctx, db, table, key, json.RawMessage(body), cond)
	})
}

func runInsert(args []string) error {
	return writeCmd("insert", args, func(ctx context.Context, cl *client.Client, db, table string, key client.Key, body []byte, _ *client.Conditions) (*client.WriteResult, error) {
		return cl.Insert(ctx, db, table, key, json.RawMessage(body))
	})
}

func runPatch(args []string) error {
	return writeCmd("patch", args, func(ctx context.Context, cl *client.Client, db, table string, key client.Key, body []byte, cond *client.Conditions) (*client.WriteResult, error) {
		var p client.Patch
		if err := json.Unmarshal(body, &p); err != nil {
			return nil, fmt.Errorf("patch body: %w", err)
		}
		return cl.Patch(ctx, db, table, key, p, cond)
	})
}

func runDelete(args []string) error {
	return writeCmd("delete", args, func(ctx context.Context, cl *client.Client, db, table string, key client.Key, _ []byte, cond *client.Conditions) (*client.WriteResult, error) {
		return cl.Delete(ctx, db, table, key, cond)
	})
}

func runQuery(args []string) error {
	fs := flag.NewFlagSet("query", flag.ExitOnError)
	c := commonFlags(fs)
	fields := fs.String("fields", "", "comma-separated dot paths to project")
	limit := fs.Int("limit", 100, "page size")
	all := fs.Bool("all", false, "follow continuation tokens to the end of the collection")
	where := fs.String("where", "", `select by indexed fields: 'from:bob AND isInbox:true', 'createdOn:[1 TO 9]', words, "phrases", OR, NOT, ( )`)
	sort := fs.String("sort", "", "with --where: order by an attribute-indexed field (field, or -field descending); default relevance for words, else key order")
	first := fs.String("next", "", "continue from a page's continuation token")
	parseArgs(fs, args)
	db, table, key, err := parsePath(fs, 3)
	if err != nil {
		return err
	}
	if *sort != "" && *where == "" {
		return fmt.Errorf("--sort needs --where")
	}
	cl, ctx, cancel := c.client()
	defer cancel()
	next := *first
	for {
		var p *client.Page
		ro := &client.ReadOptions{Fields: fieldsOf(*fields)}
		if *where != "" {
			p, err = cl.Query(ctx, db, table, key, client.Query{Where: *where, Sort: *sort, Limit: *limit, Next: next}, ro)
		} else {
			p, err = cl.Collection(ctx, db, table, key, *limit, next, ro)
		}
		if err != nil {
			return err
		}
		for _, d := range p.Documents {
			line, _ := json.Marshal(map[string]any{"key": d.Key, "scn": d.SCN, "document": d.Body})
			fmt.Println(string(line))
		}
		if next = p.Next; next == "" || !*all {
			if next != "" {
				fmt.Fprintln(os.Stderr, "more: --next", next)
			}
			return nil
		}
	}
}

func runSchema(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: cortado schema create-db DB [--partitions N] [--replicas N] [--replication semi-sync|async] [--min-in-sync N] [--retention-max-age D] [--retention-max-bytes N] | alter-db DB [--replicas N] [--min-in-sync N] [--retention-max-age D] [--retention-max-bytes N] [--retention-max-slave-lag D] | register DB/TABLE -d DEF | show DB[/TABLE[/VERSION]] | list [--after DB] [--limit N]")
	}
	fs := flag.NewFlagSet("schema "+args[0], flag.ExitOnError)
	c := commonFlags(fs)
	partitions := fs.Int("partitions", 0, "create-db: number of partitions (default 64)")
	replicas := fs.Int("replicas", 0, "create-db, alter-db: replicas per partition")
	replication := fs.String("replication", "", "create-db: semi-sync (default) or async")
	minInSync := fs.Int("min-in-sync", 0, "create-db, alter-db (only upwards): replicas, the master included, that must durably hold a semi-sync write before it is acknowledged (default 2 with 2 replicas or more)")
	var retention client.Retention
	fs.StringVar(&retention.MaxAge, "retention-max-age", "", "create-db, alter-db: how long the commit logs keep a commit, as a Go duration (default 24h)")
	fs.Int64Var(&retention.MaxBytes, "retention-max-bytes", 0, "create-db, alter-db: bytes a partition's commit log keeps (default 1 GiB, -1 no limit)")
	fs.StringVar(&retention.MaxSlaveLag, "retention-max-slave-lag", "", "create-db, alter-db: how far behind a slave may fall and still keep its master's log for itself (default 1h)")
	after := fs.String("after", "", "list: the databases after this name")
	limit := fs.Int("limit", 0, "list: at most this many (default 1,000)")
	data := fs.String("d", "", "register: table definition {\"key\":[…],\"schema\":{…}}: JSON, @file or - (stdin)")
	parseArgs(fs, args[1:])
	if args[0] == "list" {
		if fs.NArg() != 0 {
			return fmt.Errorf("schema list takes no argument")
		}
		cl, ctx, cancel := c.client()
		defer cancel()
		l, err := cl.Databases(ctx, *after, *limit)
		if err != nil {
			return err
		}
		if l.Next != "" {
			fmt.Fprintln(os.Stderr, "more: --after", l.Next)
		}
		return printJSON(l)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("schema %s takes one path argument", args[0])
	}
	parts := strings.Split(strings.Trim(fs.Arg(0), "/"), "/")
	cl, ctx, cancel := c.client()
	defer cancel()
	switch args[0] {
	case "create-db":
		def := client.Database{Partitions: *partitions, Replicas: *replicas, Replication: *replication, MinInSync: *minInSync}
		if retention != (client.Retention{}) {
			def.Retention = &retention
		}
		if err := cl.CreateDatabase(ctx, parts[0], def); err != nil {
			return err
		}
		return printJSON(map[string]string{"database": parts[0]})
	case "alter-db":
		if *partitions != 0 || *replication != "" {
			return fmt.Errorf("alter-db changes --replicas, --min-in-sync (upwards) and the retention: a database's partitions and replication are fixed once it exists")
		}
		change := client.Database{Replicas: *replicas, MinInSync: *minInSync}
		if retention != (client.Retention{}) {
			change.Retention = &retention
		}
		if change.Replicas == 0 && change.MinInSync == 0 && change.Retention == nil {
			return fmt.Errorf("alter-db: give --replicas, --min-in-sync or a --retention-… flag")
		}
		if err := cl.AlterDatabase(ctx, parts[0], change); err != nil {
			return err
		}
		d, err := cl.Database(ctx, parts[0])
		if err != nil {
			return err
		}
		return printJSON(d)
	case "register":
		if len(parts) != 2 {
			return fmt.Errorf("register takes DB/TABLE")
		}
		body, err := bodyArg(*data)
		if err != nil {
			return err
		}
		var def client.TableSchema
		if err := json.Unmarshal(body, &def); err != nil {
			return fmt.Errorf("table definition: %w", err)
		}
		v, err := cl.RegisterSchema(ctx, parts[0], parts[1], def)
		if err != nil {
			return err
		}
		return printJSON(map[string]int{"version": v})
	case "show":
		switch len(parts) {
		case 1:
			d, err := cl.Database(ctx, parts[0])
			if err != nil {
				return err
			}
			return printJSON(d)
		case 2:
			t, err := cl.Table(ctx, parts[0], parts[1])
			if err != nil {
				return err
			}
			return printJSON(t)
		case 3:
			var v int
			if _, err := fmt.Sscan(parts[2], &v); err != nil {
				return fmt.Errorf("version %q is not a number", parts[2])
			}
			s, err := cl.Schema(ctx, parts[0], parts[1], v)
			if err != nil {
				return err
			}
			return printRaw(s)
		}
		return fmt.Errorf("show takes DB, DB/TABLE or DB/TABLE/VERSION")
	}
	return fmt.Errorf("unknown schema command %q", args[0])
}
