package main

import (
	"fmt"
	"image/color"
	"slices"
	"strings"
	"testing"
)

// Every chart draws a variant with style: one colour per strategy, shared
// by its variants and told apart by dashes; the floors and the peer in
// colours no strategy uses.
func TestChartStyles(t *testing.T) {
	t.Parallel()
	rgba := func(c color.Color) [4]uint32 {
		r, g, b, a := c.RGBA()
		return [4]uint32{r, g, b, a}
	}
	byStrategy := map[string][4]uint32{}
	var strategyColours [][4]uint32
	dashes := map[string][]string{} // colour of a strategy -> dash patterns seen
	for _, v := range allVariants() {
		if v.Redis || v.Name == naive.Name || v.Seed {
			continue
		}
		c := rgba(style(v.Name).Color)
		s := string(v.Strategy)
		if prev, ok := byStrategy[s]; ok && prev != c {
			t.Errorf("%s is not drawn in %s's colour", v.Name, s)
		}
		if _, ok := byStrategy[s]; !ok {
			if slices.Contains(strategyColours, c) {
				t.Errorf("strategy %s shares its colour with another", s)
			}
			byStrategy[s] = c
			strategyColours = append(strategyColours, c)
		}
		d := fmtDashes(style(v.Name).Dashes)
		if slices.Contains(dashes[s], d) {
			t.Errorf("%s has the dashes of another %s variant", v.Name, s)
		}
		dashes[s] = append(dashes[s], d)
	}
	for _, name := range []string{peerName, peerEverysec.Name, peerAlways.Name, naive.Name, floorName, writeFloorName, pingFloorName} {
		if slices.Contains(strategyColours, rgba(style(name).Color)) {
			t.Errorf("%s is drawn in a strategy's colour", name)
		}
	}
	floors := map[string]bool{}
	for _, name := range []string{floorName, writeFloorName, pingFloorName} {
		d := fmtDashes(style(name).Dashes)
		if d == "[]" || floors[d] {
			t.Errorf("floor %s: dashes %s, want a pattern of its own", name, d)
		}
		floors[d] = true
	}
	if style(peerName).Dashes != nil || style(peerName).Width <= style("upsert").Width {
		t.Errorf("the peer is not a thick solid line: %+v", style(peerName))
	}
	for _, v := range tiersVariants() {
		base := strings.TrimSuffix(v.Name, "-"+setTiers)
		if got, want := style(v.Name), style(base); rgba(got.Color) != rgba(want.Color) || fmtDashes(got.Dashes) != fmtDashes(want.Dashes) {
			t.Errorf("%s is not drawn as %s", v.Name, base)
		}
	}
}

func fmtDashes[T any](d []T) string {
	s := "["
	for i, x := range d {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprint(x)
	}
	return s + "]"
}
