package service

import (
	"flag"
	"fmt"
	"os"
	"runtime"
)

// HandleVersion parses the command line, whose only flag is -version: with
// it, it prints the service's name, its version (stamped at build time with
// -ldflags "-X main.version=...") and the Go version, and exits 0. Every
// binary calls it first, so `<binary> -version` answers without reading any
// configuration or touching the network.
func HandleVersion(name, version string) {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	show := fs.Bool("version", false, "print the version and exit")
	_ = fs.Parse(os.Args[1:]) // ExitOnError: a bad flag exits 2 with usage
	if *show {
		fmt.Printf("%s %s %s\n", name, version, runtime.Version())
		os.Exit(0)
	}
}
