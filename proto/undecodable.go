package proto

import "strconv"

// UndecodableJobID names a message of StreamJobs that holds no usable job
// id (it cannot be decoded) by its stream sequence: "seq-<seq>". The
// runner records such a job under this id and terminates it with
// TermReason(UndecodableJobID(seq), cause); the notifier reads its record
// by the same id when the job reaches it. Notifiers before this name wrote
// such records as "jobs-seq-<seq>", which a notifier reads too.
func UndecodableJobID(seq uint64) string { return "seq-" + strconv.FormatUint(seq, 10) }
