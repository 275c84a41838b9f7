// Command fakeanthropic serves a stand-in of the Anthropic Messages API on
// a loopback address, for running the real Claude Code CLI against scripted
// conversations (see package fakeanthropic for the scripts). It prints
// "listening on http://<addr>" and logs one line per request to stderr.
//
//	fakeanthropic -addr 127.0.0.1:0 -script commit
//	ANTHROPIC_BASE_URL=http://<addr> ANTHROPIC_API_KEY=x claude -p ...
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/orch-dev/orch/bench/internal/fakeanthropic"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address (loopback)")
	script := flag.String("script", "commit", "default script: "+strings.Join(fakeanthropic.Scripts, ", "))
	flag.Parse()
	if err := run(*addr, *script); err != nil {
		fmt.Fprintln(os.Stderr, "fakeanthropic:", err)
		os.Exit(1)
	}
}

func run(addr, script string) error {
	if !slices.Contains(fakeanthropic.Scripts, script) {
		return fmt.Errorf("unknown script %q", script)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("listen address %q: loopback only", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	srv := &fakeanthropic.Server{Default: script, Log: func(c fakeanthropic.Call) {
		log.Printf("#%d %s model=%s stream=%v tools=%d messages=%d script=%s answer=%s", c.N, c.Path, c.Model, c.Stream, c.Tools, c.Messages, c.Script, c.Answer)
	}}
	return http.Serve(ln, srv)
}
