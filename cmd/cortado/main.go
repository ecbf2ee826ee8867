// Command cortado is Cortado's one binary: `cortado serve` runs every role
// in one process; the other subcommands are the CLI for a running server.
package main

import (
	"fmt"
	"os"
)

var commands = []struct {
	name, help string
	run        func(args []string) error
}{
	{"serve", "run every role in one process (embedded etcd, storage, router)", runServe},
	{"storage", "run a storage node against an external etcd (--etcd-endpoints)", runStorage},
	{"router", "run a router against an external etcd: routes by the routing tables", runRouter},
	{"relay", "run a relay against an external etcd: buffers masters' logs and serves slaves", runRelay},
	{"controller", "run a controller against an external etcd (one leads, others stand by)", runController},
	{"etcd", "run a single-member etcd for a local multi-process cluster", runEtcd},
	{"cluster", "inspect a cluster: cluster status|check", runCluster},
	{"get", "read a document, collection or multi-get: get db/table/key…", runGet},
	{"put", "insert or replace a document: put db/table/key… -d JSON (or stdin)", runPut},
	{"insert", "insert with an auto-increment key: insert db/table/prefix… -d JSON", runInsert},
	{"patch", "partially update a document: patch db/table/key… -d PATCH", runPatch},
	{"delete", "delete a document or a collection: delete db/table/key…", runDelete},
	{"query", "list a collection, or select from a document group by indexed fields: query db/table/prefix… [--where Q] [--sort F]", runQuery},
	{"tail", "follow a database's change stream: tail db [--tables T] [--since TOKEN|now|beginning]", runTail},
	{"backup", "write a database's backup to a file: backup db -o FILE", runBackup},
	{"restore", "restore a backup file into a new database: restore FILE [--as NAME]", runRestore},
	{"schema", "manage databases and schemas: schema create-db|alter-db|register|show|list …", runSchema},
	{"bench", "measure GET/PUT throughput and latency against a server", runBench},
	{"version", "print the commit this binary was built from, and the protocol and storage formats it reads", runVersion},
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cortado <command> [flags] [args]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", c.name, c.help)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'cortado <command> -h' for a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	for _, c := range commands {
		if c.name == os.Args[1] {
			if err := c.run(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "cortado "+c.name+":", err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "cortado: unknown command %q\n\n", os.Args[1])
	usage()
	os.Exit(2)
}
