package main

import (
	"bytes"
	"strings"
	"testing"
)

// -citus-url runs its own comparison: the flags that choose what the other
// runs compare are refused beside it, and its URL's password never reaches
// the recorded command.
func TestParseCitusOptions(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-citus-url", "postgres://h/db", "-strategies", "upsert"},
		{"-citus-url", "postgres://h/db", "-scenarios", "seed"},
		{"-citus-url", "postgres://h/db", "-target", "http://127.0.0.1:1"},
		{"-citus-url", "postgres://h/db", "-database-url", "postgres://h/db"},
	} {
		if _, err := parseOptions(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	o, err := parseOptions([]string{"-citus-url", "postgres://u:secret@h/db", "-concurrency", "4"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o.citusURL == "" || !o.concurrencySet || o.concurrency[0] != 4 {
		t.Errorf("options %+v: want the Citus URL and 4 workers", o)
	}
	if strings.Contains(o.command, "secret") {
		t.Errorf("the recorded command shows the database password: %s", o.command)
	}
}
