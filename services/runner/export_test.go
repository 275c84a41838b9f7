package runner

// SetBeforeRunningWrite sets testHookBeforeRunningWrite until the test
// ends (cleanup).
func SetBeforeRunningWrite(f func(jobID string)) (cleanup func()) {
	testHookBeforeRunningWrite = f
	return func() { testHookBeforeRunningWrite = nil }
}
