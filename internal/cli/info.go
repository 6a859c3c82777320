package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/ddstore-go/ddstore"
	"github.com/ddstore-go/ddstore/internal/bench"
)

func runInfo(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("info", "Show what the agent of a namespace on this node holds: variables, rows, bytes, owners, memory in use, counters.", stderr)
	ns := fs.String("namespace", ddstore.DefaultNamespace(), "job namespace")
	node := fs.String("node", ddstore.DefaultNode(), "node identity")
	socket := fs.String("socket", "", "agent socket (default: derived from namespace and node)")
	runDir := fs.String("run-dir", "", "directory for sockets")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *socket == "" {
		*socket = ddstore.SocketPath(*runDir, *ns, *node)
	}
	in, err := ddstore.QueryAgent(*socket, *ns, *node)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(in)
	}
	fmt.Fprintf(stdout, "agent pid %d, namespace %q, node %q, coordinator %v\n", in.Pid, in.Namespace, in.Node, in.Coordinator)
	fmt.Fprintf(stdout, "socket %s, peer %s, %d clients, %d receive regions\n", in.Socket, in.PeerAddr, in.Clients, in.Regions)
	if in.Auth != "" {
		fmt.Fprintf(stdout, "keys: %s\n", in.Auth)
	}
	if in.MemoryBudget > 0 {
		fmt.Fprintf(stdout, "memory in use: %s of a %s budget\n", humanBytes(in.MemoryBytes), humanBytes(in.MemoryBudget))
	} else {
		fmt.Fprintf(stdout, "memory in use: %s (no budget)\n", humanBytes(in.MemoryBytes))
	}
	if len(in.Nodes) > 0 {
		fmt.Fprintf(stdout, "nodes: %s\n", strings.Join(in.Nodes, ", "))
	}
	t := bench.NewTable("variable", "rows", "disp", "itemsize", "row bytes", "bytes", "ranks", "local ranks", "local bytes", "owners")
	for _, v := range in.Variables {
		rows := "(unpublished)"
		if v.Published {
			rows = fmt.Sprint(v.TotalRows)
		}
		// A ragged variable's rows have sizes of their own: its kind and
		// trailing shape stand for a row size; its index counts as local.
		rowBytes := fmt.Sprint(v.RowBytes)
		if v.Kind == "ragged" {
			rowBytes = fmt.Sprintf("ragged %v", v.Shape)
		}
		t.Row(v.Name, rows, fmt.Sprint(v.Disp), fmt.Sprint(v.ItemSize), rowBytes, humanBytes(v.TotalBytes), fmt.Sprint(len(v.ShardRows)),
			fmt.Sprint(v.LocalRanks), humanBytes(v.LocalBytes+v.IndexBytes), ownersSummary(v.Owners))
	}
	fmt.Fprintln(stdout)
	if err := t.Write(stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\ncounters: %v\n", in.Counters)
	return nil
}

// ownersSummary compresses the node of each rank into runs: "a x2, b x3".
func ownersSummary(owners []string) string {
	var parts []string
	for i := 0; i < len(owners); {
		j := i
		for j < len(owners) && owners[j] == owners[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%s x%d", owners[i], j-i))
		i = j
	}
	return strings.Join(parts, ", ")
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
