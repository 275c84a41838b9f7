package service

import (
	"flag"
	"fmt"
	"os"
	"runtime"
)

// HandleFlags parses the command line. Every binary calls it first, so
// its flags answer without reading any configuration or touching NATS:
//
//   - -version prints the service's name, its version (stamped at build
//     time with -ldflags "-X main.version=...") and the Go version, and
//     exits 0.
//   - -healthcheck <url> GETs url and exits 0 on a 2xx answer, 1 on
//     anything else. The images have no wget or curl (distroless, or
//     Debian slim), so a container health check runs the binary itself:
//     ["CMD", "/usr/local/bin/notifier", "-healthcheck",
//     "http://127.0.0.1:8082/healthz"].
func HandleFlags(name, version string) {
	buildVersion = version
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	show := fs.Bool("version", false, "print the version and exit")
	probe := fs.String("healthcheck", "", "GET this URL, exit 0 on a 2xx answer and 1 otherwise (container health checks)")
	_ = fs.Parse(os.Args[1:]) // ExitOnError: a bad flag exits 2 with usage
	switch {
	case *show:
		fmt.Printf("%s %s %s\n", name, version, runtime.Version())
		os.Exit(0)
	case *probe != "":
		if err := Healthcheck(*probe, HealthcheckTimeout); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// buildVersion is the version HandleFlags was given.
var buildVersion = "dev"

// Version is the version the binary was stamped with, as given to
// HandleFlags; "dev" in a process that never called it (tests, `make
// run`). orch_build_info reports it.
func Version() string { return buildVersion }
