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
	buildVersion = version
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	show := fs.Bool("version", false, "print the version and exit")
	_ = fs.Parse(os.Args[1:]) // ExitOnError: a bad flag exits 2 with usage
	if *show {
		fmt.Printf("%s %s %s\n", name, version, runtime.Version())
		os.Exit(0)
	}
}

// buildVersion is the version HandleVersion was given.
var buildVersion = "dev"

// Version is the version the binary was stamped with, as given to
// HandleVersion; "dev" in a process that never called it (tests, `make
// run`). orch_build_info reports it.
func Version() string { return buildVersion }
