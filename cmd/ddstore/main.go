// Command ddstore is the node agent, the inspection tool and the benchmark
// of ddstore; see `ddstore --help`.
package main

import (
	"os"

	"github.com/ddstore-go/ddstore/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
