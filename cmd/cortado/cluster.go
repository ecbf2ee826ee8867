package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/cortado-db/cortado/internal/controller"
	"github.com/cortado-db/cortado/internal/topo"
)

func runCluster(args []string) error {
	if len(args) == 0 || (args[0] != "status" && args[0] != "check") {
		return fmt.Errorf("usage: cortado cluster status [--json] | check [--db NAME] [--json]")
	}
	fs := flag.NewFlagSet("cluster "+args[0], flag.ExitOnError)
	c := commonFlags(fs)
	asJSON := fs.Bool("json", false, "print the JSON the server answers")
	db := fs.String("db", "", "check: only this database")
	parseArgs(fs, args[1:])
	ctx, cancel := context.WithTimeout(context.Background(), *c.timeout)
	defer cancel()
	method, path := http.MethodGet, "/_cluster"
	if args[0] == "check" {
		method, path = http.MethodPost, "/_cluster/check"
		if *db != "" {
			path += "?db=" + url.QueryEscape(*db)
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(*c.url, "/")+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	if *asJSON {
		_, err := os.Stdout.Write(body)
		return err
	}
	if args[0] == "status" {
		var st controller.Status
		if err := json.Unmarshal(body, &st); err != nil {
			return err
		}
		printStatus(&st)
		return nil
	}
	var res struct {
		Single     bool
		Partitions []controller.PartitionCheck
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return err
	}
	if res.Single {
		fmt.Println(singleNode + ": no replicas to compare")
		return nil
	}
	return printCheck(res.Partitions)
}

// buildColumns are a process's BUILD and PROTOCOL columns: "?" where a
// process of a release before builds were registered, or one not live,
// gave none.
func buildColumns(build string, protocol uint32) (string, string) {
	p := "?"
	if build == "" {
		build = "?"
	}
	if protocol != 0 {
		p = fmt.Sprint(protocol)
	}
	return build, p
}

// singleNode is what the cluster commands say of a server that is one
// node.
const singleNode = "one storage node, not a cluster: `cortado serve` without --nodes masters every partition itself"

func printStatus(st *controller.Status) {
	if st.Single {
		fmt.Println(singleNode)
		return
	}
	leader := st.Controller
	if leader == "" {
		leader = "(none elected)"
	}
	fmt.Println("controller:", leader)
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\nNODE\tLIVE\tMASTERS\tSLAVES\tRACK\tBUILD\tPROTOCOL\tURL")
	for _, n := range st.Nodes {
		live := "yes"
		if !n.Live {
			live = "no"
		}
		url := n.URL
		if n.Error != "" {
			url += "  (" + n.Error + ")"
		}
		build, protocol := buildColumns(n.Build, n.Protocol)
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", n.ID, live, n.Masters, n.Slaves, n.Rack, build, protocol, url)
	}
	if len(st.Processes) > 0 {
		fmt.Fprintln(w, "\nPROCESS\tROLE\tBUILD\tPROTOCOL\tURL")
		for _, p := range st.Processes {
			build, protocol := buildColumns(p.Build, p.Protocol)
			role := p.Role
			if p.Role == topo.RoleController && p.ID == st.Controller {
				role += " (leader)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", p.ID, role, build, protocol, p.URL)
		}
	}
	for _, d := range st.Databases {
		settings := ""
		if d.Replicas > 0 {
			settings = fmt.Sprintf("; replicas %d, minInSync %d", d.Replicas, d.MinInSync)
			if d.FailoverInSync > 0 {
				settings += fmt.Sprintf(" (failovers count by %d until the raise settles)", d.FailoverInSync)
			}
		}
		fmt.Fprintf(w, "\ndatabase %s (routing table v%d%s)\nPART\tGEN\tMASTER\tSCN\tLOG (after, bytes)\tSLAVES (scn, lag in commits)\n", d.Name, d.Version, settings)
		for _, p := range d.Partitions {
			if len(p.Replicas) == 0 {
				fmt.Fprintf(w, "%d\t%d\t-\t\t\n", p.Partition, p.Generation)
				continue
			}
			m := p.Replicas[0]
			var slaves []string
			for _, r := range p.Replicas[1:] {
				lag := "?"
				if r.Lag != nil {
					lag = fmt.Sprint(*r.Lag)
				}
				slaves = append(slaves, fmt.Sprintf("%s %s %s lag %s", r.Node, strings.ToLower(r.Role), r.SCN, lag))
			}
			master := m.Node
			if m.Role != "MASTER" {
				master += " (" + strings.ToLower(m.Role) + ")"
			}
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s %d\t%s\n", p.Partition, p.Generation, master, m.SCN, m.LogStart, m.LogBytes, strings.Join(slaves, ", "))
		}
		copies := map[string]int{}
		for _, p := range d.Partitions {
			for _, c := range p.Copies {
				copies[c.Node]++
			}
		}
		if len(copies) > 0 {
			var held []string
			for _, id := range slices.Sorted(maps.Keys(copies)) {
				held = append(held, fmt.Sprintf("%s %d", id, copies[id]))
			}
			fmt.Fprintf(w, "copies kept by nodes that are no replica (deleted once every replica holds all of each): %s\n", strings.Join(held, ", "))
		}
		// Index builds: documents the latest indexes still lack, on the
		// masters (which rewrite them).
		building := map[string]uint64{}
		for _, p := range d.Partitions {
			if len(p.Replicas) > 0 {
				for t, n := range p.Replicas[0].IndexBuilding {
					building[t] += n
				}
			}
		}
		for _, t := range slices.Sorted(maps.Keys(building)) {
			fmt.Fprintf(w, "index build: table %s, %d document(s) to rewrite in its latest schema version\n", t, building[t])
		}
	}
	w.Flush()
}

func printCheck(parts []controller.PartitionCheck) error {
	counts := map[string]int{}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "DB\tPART\tSCN\tMASTER\tREPLICA\tRESULT\tDETAIL")
	for _, p := range parts {
		for _, r := range p.Replicas {
			counts[r.Result]++
			if r.Result == controller.CheckEqual {
				continue
			}
			detail := r.Error
			if len(r.Tables) > 0 {
				detail = "tables " + strings.Join(r.Tables, ", ")
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.DB, p.Partition, p.SCN, p.Master, r.Node, r.Result, detail)
		}
	}
	w.Flush()
	fmt.Printf("%d partitions: %d replicas equal, %d differ, %d unsettled, %d unreachable\n", len(parts),
		counts[controller.CheckEqual], counts[controller.CheckDiffers], counts[controller.CheckUnsettled], counts[controller.CheckUnreachable])
	if counts[controller.CheckAlarm] > 0 {
		return fmt.Errorf("%d replicas hold acknowledged commits their masters lack (see the log: an acknowledged write was lost on the master)", counts[controller.CheckAlarm])
	}
	if counts[controller.CheckDiffers] > 0 {
		return fmt.Errorf("%d replicas differ from their masters", counts[controller.CheckDiffers])
	}
	return nil
}
