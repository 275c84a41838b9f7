#!/usr/bin/env bash
# realgitea.sh: run orch (as `make run` does) against a real, throwaway
# Gitea and walk one pull request through every Gitea trigger and the
# tracker write-back. Not part of `make test` (it needs a Gitea binary and
# takes about two minutes); docs/notifier.md "Checked against real Gitea"
# says how to build Gitea and what this checks.
#
#   GITEA=/path/to/gitea deployments/local/realgitea.sh
#
# Needs bash, curl, jq, git and Go. Everything lives in a temporary
# directory (KEEP=1 keeps it and leaves both servers running, for a look
# at Gitea's hook_task table or the logs). Prints "ok" or "FAIL" per check
# and exits non-zero if any check failed.
set -euo pipefail

GITEA=${GITEA:-gitea}
# A Gitea built without the bindata tag reads its locales and templates
# from its source tree: the module as `go mod download` left it.
GITEA_SRC=${GITEA_SRC:-$(go env GOMODCACHE)/code.gitea.io/gitea@v1.26.0}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(mktemp -d "${TMPDIR:-/tmp}/orch-realgitea.XXXXXX")
# The secret and names of the gateway's tests (fixture-secret, acme/widgets,
# alice trusted, agent-bot the agent), so that a delivery kept from
# Gitea's hook_task table is a test fixture as it is.
SECRET=fixture-secret
API_TOKEN=realgitea-api-token-of-32-characters-or-more
FAILS=0
PIDS=()

cleanup() {
	if [ "${KEEP:-}" = 1 ]; then
		echo "kept: $ROOT (pids ${PIDS[*]})"
		return
	fi
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$ROOT"
}
trap cleanup EXIT

# freeport prints a loopback port nobody listens on.
freeport() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

check() { # check <what> <command...>: runs the command, prints ok/FAIL
	local what=$1
	shift
	if "$@"; then echo "ok   $what"; else echo "FAIL $what"; FAILS=$((FAILS + 1)); fi
}

# waitfor <seconds> <command...>: until the command succeeds.
waitfor() {
	local end=$((SECONDS + $1))
	shift
	until "$@" 2>/dev/null; do
		[ "$SECONDS" -lt "$end" ] || return 1
		sleep 0.5 # polling a server from outside: there is no event to wait on
	done
}

GITEA_PORT=$(freeport)
GW_PORT=$(freeport)
NATS_PORT=$(freeport)
GITEA_URL=http://127.0.0.1:$GITEA_PORT
GW_URL=http://127.0.0.1:$GW_PORT

# --- Gitea ------------------------------------------------------------
mkdir -p "$ROOT/gitea/custom/conf"
INI=$ROOT/gitea/custom/conf/app.ini
cat >"$INI" <<EOF
APP_NAME = orch realgitea
RUN_MODE = prod
; lets a container's root run it; ignored for any other user
I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true
WORK_PATH = $ROOT/gitea
[server]
HTTP_ADDR = 127.0.0.1
HTTP_PORT = $GITEA_PORT
ROOT_URL = $GITEA_URL/
DISABLE_SSH = true
STATIC_ROOT_PATH = $GITEA_SRC
OFFLINE_MODE = true
[database]
DB_TYPE = sqlite3
PATH = $ROOT/gitea/gitea.db
[repository]
ROOT = $ROOT/gitea/repos
[security]
INSTALL_LOCK = true
SECRET_KEY = realgitea-secret-key-not-for-production
INTERNAL_TOKEN = realgitea-internal-token-not-for-production-0123456789
[service]
DISABLE_REGISTRATION = true
[webhook]
ALLOWED_HOST_LIST = loopback
DELIVER_TIMEOUT = 5
[log]
MODE = file
LEVEL = info
ROOT_PATH = $ROOT/gitea/log
[mailer]
ENABLED = false
EOF
g() { "$GITEA" --config "$INI" --work-path "$ROOT/gitea" "$@"; }
echo "gitea $(g --version | awk '{print $3}') on $GITEA_URL, data in $ROOT"
g migrate >/dev/null
g admin user create --admin --username alice --password 'alice-Passw0rd!' --email alice@example.com --must-change-password=false >/dev/null
g admin user create --username agent-bot --password 'bot-Passw0rd!' --email agent-bot@example.com --must-change-password=false >/dev/null
ALICE=$(g admin user generate-access-token --username alice --token-name realgitea --scopes write:repository,write:issue,write:user,write:organization --raw | grep -oE '[0-9a-f]{40}$')
BOT=$(g admin user generate-access-token --username agent-bot --token-name orch --scopes write:repository,write:issue --raw | grep -oE '[0-9a-f]{40}$')
"$GITEA" --config "$INI" --work-path "$ROOT/gitea" web >"$ROOT/gitea.out" 2>&1 &
PIDS+=($!)
waitfor 60 curl -sf "$GITEA_URL/api/healthz" -o /dev/null

# api <token> <method> <path> [json]: a Gitea API call; prints the body.
api() {
	curl -sS -X "$2" -H "Authorization: token $1" -H 'Content-Type: application/json' \
		"$GITEA_URL/api/v1$3" ${4:+--data "$4"}
}
api "$ALICE" POST /orgs '{"username":"acme"}' >/dev/null
api "$ALICE" POST /orgs/acme/repos '{"name":"widgets","auto_init":true,"default_branch":"main","private":false}' >/dev/null
api "$ALICE" PUT /repos/acme/widgets/collaborators/agent-bot '{"permission":"write"}' >/dev/null

# --- orch, as `make run` runs it ---------------------------------------
cat >"$ROOT/projects.yaml" <<EOF
projects:
  - key: widgets
    gitea_repo: acme/widgets
    clone_url: $GITEA_URL/acme/widgets.git
    default_branch: main
    mention: "@agent-bot"
    agent_user: agent-bot
    trusted_actors: [alice]
EOF
(cd "$HERE" && go build -o "$ROOT/orch-local" .)
ORCH_NATS_URL=nats://127.0.0.1:$NATS_PORT ORCH_HTTP_ADDR=127.0.0.1:$GW_PORT \
	ORCH_DATA_DIR=$ROOT/orch ORCH_PROJECTS_FILE=$ROOT/projects.yaml \
	ORCH_GITEA_SECRET=$SECRET ORCH_PLANE_SECRET=unused ORCH_API_TOKEN=$API_TOKEN \
	ORCH_AGENT_COMMAND="sh $HERE/agent.sh" ORCH_RETRY_DELAY=2s \
	ORCH_AGENT_ENV=ORCH_STANDIN_SLEEP ORCH_STANDIN_SLEEP=6 ORCH_LOG_FORMAT=console \
	ORCH_GITEA_URL=$GITEA_URL ORCH_GITEA_TOKEN=$BOT ORCH_PUBLIC_URL=$GW_URL \
	"$ROOT/orch-local" >"$ROOT/orch.log" 2>&1 &
PIDS+=($!)
waitfor 60 curl -sf "$GW_URL/readyz" -o /dev/null

HOOK=$(api "$ALICE" POST /repos/acme/widgets/hooks "$(jq -nc --arg url "$GW_URL/webhooks/gitea" --arg s "$SECRET" \
	'{type:"gitea",active:true,branch_filter:"*",events:["push","issues","pull_request","workflow_run"],config:{url:$url,content_type:"json",secret:$s}}')" | jq .id)

# --- helpers over orch's API -------------------------------------------
orch() { curl -sf -H "Authorization: Bearer $API_TOKEN" "$GW_URL$1"; }
# jobs_of <kind>: the ids of the jobs of that kind, oldest first.
jobs_of() { orch '/queue?limit=100' | jq -r --arg k "$1" '[.recent[] | select(.kind==$k)] | sort_by(.updated_at) | .[].id'; }
job_field() { orch "/jobs/$1" | jq -r "$2"; }
state_is() { [ "$(job_field "$1" .status.state)" = "$2" ]; }
code() { curl -s -o /dev/null -w '%{http_code}' -X "$2" -H "Authorization: token $1" -H 'Content-Type: application/json' "$GITEA_URL/api/v1$3" ${4:+--data "$4"}; }
count_of() { [ "$(jobs_of "$1" | grep -c .)" -ge "$2" ]; }

# --- 1. real webhooks, 2. write-back on the pull request ---------------
git -c init.defaultBranch=main clone -q "http://agent-bot:$BOT@127.0.0.1:$GITEA_PORT/acme/widgets.git" "$ROOT/clone"
cd "$ROOT/clone"
git config user.name agent-bot && git config user.email agent-bot@example.com
git switch -q -c agent/demo && echo "sort" >sort.txt && git add . && git commit -qm "add sorting"
git push -q origin agent/demo 2>/dev/null
SHA1=$(git rev-parse HEAD)
PR=$(api "$BOT" POST /repos/acme/widgets/pulls '{"head":"agent/demo","base":"main","title":"Add sorting","body":"Sorts widgets."}' | jq .number)
echo "pull request #$PR opened at $SHA1, hook $HOOK"

comments() { api "$BOT" GET "/repos/acme/widgets/issues/$1/comments"; }
tracking() { comments "$PR" | jq --arg m "<!-- orch:job:$1 -->" '[.[] | select(.body | startswith($m))]'; }
shows() { tracking "$1" | jq -e --arg s "$2" 'length==1 and (.[0].body | contains($s))' >/dev/null; }
status_of() { api "$BOT" GET "/repos/acme/widgets/commits/$1/statuses" | jq -r --arg c "orch/$2" '[.[] | select(.context==$c)] | sort_by(.id) | last | .status'; }
has_status() { [ "$(status_of "$1" "$2")" = "$3" ]; }

check "pull request opened queues review" waitfor 30 count_of review 1
R1=$(jobs_of review | head -1)
check "review carries the head sha" test "$(job_field "$R1" .job.task.head_sha)" = "$SHA1"
check "review is on task demo, branch agent/demo, PR #$PR" \
	test "$(job_field "$R1" '.job.task.id + " " + .job.task.branch + " " + (.job.task.pr|tostring)')" = "demo agent/demo $PR"
check "tracking comment shows running" waitfor 30 shows "$R1" "· running"
check "commit status orch/review pending while it runs" waitfor 30 has_status "$SHA1" review pending
check "review job done" waitfor 60 state_is "$R1" done
check "the same comment edited to done" waitfor 30 shows "$R1" "· done"
check "its updated_at moved past created_at" test "$(tracking "$R1" | jq -r '.[0].created_at != .[0].updated_at')" = true
check "commit status orch/review success" waitfor 30 has_status "$SHA1" review success

echo "synced" >>sort.txt && git commit -qam "sync" && git push -q origin agent/demo 2>/dev/null
SHA2=$(git rev-parse HEAD)
check "push to the pull request queues a second review" waitfor 30 count_of review 2
R2=$(jobs_of review | tail -1)
check "second review carries the new head sha" test "$(job_field "$R2" .job.task.head_sha)" = "$SHA2"
check "its source is pull_request_sync/synchronized" test "$(job_field "$R2" .job.source.event)" = pull_request_sync/synchronized
check "second review done, its comment too" waitfor 60 shows "$R2" "· done"
check "commit status orch/review success on the new head" waitfor 30 has_status "$SHA2" review success

api "$ALICE" POST "/repos/acme/widgets/issues/$PR/comments" '{"body":"@agent-bot please explain the sort order"}' >/dev/null
check "comment mentioning @agent-bot queues respond" waitfor 30 count_of respond 1
RS=$(jobs_of respond | head -1)
check "respond is on task demo at the head sha" test "$(job_field "$RS" '.job.task.id + " " + .job.task.head_sha')" = "demo $SHA2"
check "respond done, its comment too" waitfor 60 shows "$RS" "· done"

api "$ALICE" POST "/repos/acme/widgets/pulls/$PR/reviews" '{"event":"REQUEST_CHANGES","body":"please handle empty lists"}' >/dev/null
check "review requesting changes queues fix" waitfor 30 count_of fix 1
FX=$(jobs_of fix | head -1)
check "fix carries the head sha" test "$(job_field "$FX" .job.task.head_sha)" = "$SHA2"
check "fix done, its comment too" waitfor 60 shows "$FX" "· done"

# --- 3. orch's own comments queue nothing ------------------------------
n_tracking=$(comments "$PR" | jq '[.[] | select(.body | startswith("<!-- orch:job:"))] | length')
check "one tracking comment per job ($n_tracking of 4)" test "$n_tracking" = 4
# Each comment arrives as pull_request_comment created, each edit as edited.
logged() { [ "$(grep -c "$2" "$ROOT/orch.log")" -ge "$1" ]; } # logged <n> <pattern>
check "orch's comments answered ignored as the agent's own" \
	waitfor 30 logged 4 "webhook ignored.*pull_request_comment.*agent's own account"
check "their edits answered ignored" waitfor 30 logged 4 'webhook ignored.*pull_request_comment.*action \\"edited\\"'

check "no respond beyond alice's one" test "$(jobs_of respond | grep -c .)" = 1

# --- a pull request deleted before its job's comment was written --------
api "$ALICE" POST "/repos/acme/widgets/issues/$PR/comments" '{"body":"@agent-bot once more"}' >/dev/null
check "a second respond runs (keeps the runner busy)" waitfor 30 sh -c "[ \$(curl -sf -H 'Authorization: Bearer $API_TOKEN' '$GW_URL/queue' | jq '.counts.running') = 1 ]"
git switch -q -c agent/gone main && echo gone >gone.txt && git add . && git commit -qm gone && git push -q origin agent/gone 2>/dev/null
PR2=$(api "$BOT" POST /repos/acme/widgets/pulls '{"head":"agent/gone","base":"main","title":"Gone"}' | jq .number)
check "pull request #$PR2 queues a review" waitfor 30 count_of review 3
RG=$(jobs_of review | tail -1)
check "deleting pull request #$PR2 answers 204" test "$(code "$ALICE" DELETE "/repos/acme/widgets/issues/$PR2")" = 204
check "its job runs anyway" waitfor 60 state_is "$RG" done
check "its write-back stops for good" waitfor 30 grep -q "write-back stopped.*$RG" "$ROOT/orch.log"
check "and is not retried" sh -c "! grep -q 'write-back failed, will retry.*$RG' '$ROOT/orch.log'"

api "$ALICE" PATCH "/repos/acme/widgets/pulls/$PR" '{"state":"closed"}' >/dev/null
check "closing queues cleanup" waitfor 30 count_of cleanup 1
check "no webhook refused" sh -c "! grep -q 'webhook refused' '$ROOT/orch.log'"

# --- the answers the write-back depends on (kit/trackertest/gitea.go) --
check "401 for a bad token" test "$(code bad GET "/repos/acme/widgets/pulls/$PR")" = 401
check "201 even for an unknown status state" test "$(code "$BOT" POST "/repos/acme/widgets/statuses/$SHA2" '{"state":"bogus","context":"orch/x"}')" = 201
check "500 for a status on an unknown commit" test "$(code "$BOT" POST /repos/acme/widgets/statuses/0000000000000000000000000000000000000001 '{"state":"success","context":"orch/x"}')" = 500
check "404 for a missing pull request" test "$(code "$BOT" GET /repos/acme/widgets/pulls/999)" = 404
check "404 for a missing issue" test "$(code "$BOT" GET /repos/acme/widgets/issues/999)" = 404
check "500 for the comments of a missing issue" test "$(code "$BOT" GET /repos/acme/widgets/issues/999/comments)" = 500
check "500 for a comment on a missing issue" test "$(code "$BOT" POST /repos/acme/widgets/issues/999/comments '{"body":"x"}')" = 500
check "422 for an empty comment" test "$(code "$BOT" POST "/repos/acme/widgets/issues/$PR/comments" '{"body":""}')" = 422
check "404 for editing a missing comment" test "$(code "$BOT" PATCH /repos/acme/widgets/issues/comments/99999 '{"body":"x"}')" = 404
CID=$(tracking "$R1" | jq '.[0].id')
check "deleting the pull request answers 204" test "$(code "$ALICE" DELETE "/repos/acme/widgets/issues/$PR")" = 204
check "404 for the deleted pull request" test "$(code "$BOT" GET "/repos/acme/widgets/pulls/$PR")" = 404
check "500 for its comments" test "$(code "$BOT" GET "/repos/acme/widgets/issues/$PR/comments")" = 500
check "404 for editing its tracking comment" test "$(code "$BOT" PATCH "/repos/acme/widgets/issues/comments/$CID" '{"body":"x"}')" = 404
check "201 for a status on its head (the commit stays)" test "$(code "$BOT" POST "/repos/acme/widgets/statuses/$SHA2" '{"state":"success","context":"orch/x"}')" = 201

if [ "$FAILS" -gt 0 ]; then
	echo "$FAILS check(s) failed; logs: $ROOT/orch.log, $ROOT/gitea/log"
	KEEP=1
	exit 1
fi
echo "all checks passed"
