package testutil

import (
	"errors"
	"fmt"
	"strings"
)

// CheckErr says what is wrong with err, if anything, for a test that wants
// it to wrap sentinel and its message to name every one of parts: nil when
// it does. The caller fails its test with it (t.Errorf or t.Fatalf, as the
// case needs), prefixed with what was being done.
func CheckErr(err, sentinel error, parts ...string) error {
	if err == nil {
		return fmt.Errorf("no error, want %v", sentinel)
	}
	if !errors.Is(err, sentinel) {
		return fmt.Errorf("error %q does not match %v", err, sentinel)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			return fmt.Errorf("error %q does not name %q", err, p)
		}
	}
	return nil
}
