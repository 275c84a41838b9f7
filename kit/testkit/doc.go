// Package testkit holds what the tests of every module share, so that no
// module writes its own copy:
//
//   - recorded payloads and their headers from a module's testdata, and
//     JSON edits of them (fixture.go: Fixture, ReadFile, EditJSON);
//   - a registry's YAML and a listener on a free port (RegistryYAML,
//     Listen);
//   - Gitea deliveries signed as Gitea signs them, and one request that
//     reads its answer (gitea.go: GiteaHeaders, Post);
//   - a project to run against: a real git repository, its registry, and
//     stand-in agent scripts (project.go: Repo, Registry, Project, Script,
//     AgentScript);
//   - the services of a test run for the test's length, each stopped and
//     its error checked at the end (services.go: Services);
//   - a fake Telegram Bot API that records, answers and fails as told
//     (telegram.go: Telegram);
//   - waits on a condition instead of sleeps: a process gone, a server
//     ready, a pid file written (wait.go).
//
// The fake Gitea and Plane APIs are in package trackertest, a real
// JetStream in natstest.
package testkit
