package main

import (
	"flag"
	"fmt"
	"runtime"

	"github.com/cortado-db/cortado/internal/release"
	"github.com/cortado-db/cortado/internal/storage"
	"github.com/cortado-db/cortado/internal/wire"
)

// runVersion prints what identifies this binary: what an operator
// compares between processes during a rolling upgrade
// (docs/operations.md).
func runVersion(args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("takes no arguments, got %q", fs.Args())
	}
	info := release.Get()
	built := info.Revision
	if info.Time != "" {
		built += " (" + info.Time + ")"
	}
	fmt.Printf("cortado %s\nbuilt with %s for %s/%s\ninternal protocol versions %d to %d\nstorage format %d\n",
		built, info.Go, runtime.GOOS, runtime.GOARCH, wire.MinVersion, wire.Version, storage.FormatVersion)
	return nil
}
