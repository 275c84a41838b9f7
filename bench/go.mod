module github.com/orch-dev/orch/bench

go 1.26.8

require github.com/orch-dev/orch/proto v0.0.0

replace github.com/orch-dev/orch/proto => ../proto
