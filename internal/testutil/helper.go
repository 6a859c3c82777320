package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// HelperEnv names the role a re-executed test binary plays; its arguments
// travel as JSON in HelperArgsEnv.
const (
	HelperEnv     = "DDSTORE_TEST_HELPER"
	HelperArgsEnv = "DDSTORE_TEST_HELPER_ARGS"
)

// helpers are the roles of this test binary, registered by Helper from
// package-level variables of the test files.
var helpers = map[string]func(args []byte) int{}

// Helper registers role: f gets the args HelperCmd passed, decoded, and
// its result is the process's exit status. It returns true so that a test
// file registers a role with `var _ = testutil.Helper("role", f)`.
func Helper[T any](role string, f func(T) int) bool {
	if _, dup := helpers[role]; dup {
		panic("testutil: helper role " + role + " registered twice")
	}
	helpers[role] = func(b []byte) int {
		var a T
		if err := json.Unmarshal(b, &a); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		return f(a)
	}
	return true
}

// RunHelper plays the role HelperEnv names and exits, or returns at once in
// a process that is no helper. A test package calls it from an init
// function: package-level variables (the roles) are set by then, and a
// helper so starts in milliseconds, skipping TestMain (which may build
// binaries) and the tests.
func RunHelper() {
	role := os.Getenv(HelperEnv)
	if role == "" {
		return
	}
	f := helpers[role]
	if f == nil {
		fmt.Fprintf(os.Stderr, "unknown test helper %q\n", role)
		os.Exit(2)
	}
	os.Exit(f([]byte(os.Getenv(HelperArgsEnv))))
}

// HelperCmd is this test binary re-executed as role with args; the test
// package must call RunHelper from an init function.
func HelperCmd(t testing.TB, role string, args any) *exec.Cmd {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), HelperEnv+"="+role, HelperArgsEnv+"="+string(b), NoRaceExitPause)
	return cmd
}

// NoRaceExitPause goes in the environment of every child a test starts:
// a race-built program otherwise sleeps a second as it exits.
const NoRaceExitPause = "GORACE=atexit_sleep_ms=0"

// SelfTestArgs are the arguments that run this test binary again as the
// one test named, verbose, for a launcher that starts copies of it (the
// ranks of an mpirun launch): the executable first.
func SelfTestArgs(t testing.TB, test string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []string{exe, "-test.run", "^" + test + "$", "-test.v", "-test.count=1"}
}
