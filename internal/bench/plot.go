package bench

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// A line chart, drawn with the standard library's image packages and a
// fixed bitmap font: enough for the benchmarks' plots, no plotting
// dependency.

type series struct {
	name  string
	color color.RGBA
	y     []float64 // one per x label; NaN: no point
}

type chart struct {
	title, ylabel string
	xlabels       []string
	series        []series
}

var palette = []color.RGBA{{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff}}

func (c *chart) draw(path string) error {
	const w, h, left, right, top, bottom = 760, 440, 80, 20, 40, 60
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	black, grey := color.RGBA{0, 0, 0, 0xff}, color.RGBA{0xdd, 0xdd, 0xdd, 0xff}
	text := func(x, y int, s string, c color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(s)
	}
	ymax := 0.0
	for _, s := range c.series {
		for _, v := range s.y {
			if !math.IsNaN(v) {
				ymax = math.Max(ymax, v)
			}
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	ymax = niceCeil(ymax)
	px := func(i int) int {
		if len(c.xlabels) == 1 {
			return left + (w-left-right)/2
		}
		return left + i*(w-left-right)/(len(c.xlabels)-1)
	}
	py := func(v float64) int { return h - bottom - int(v/ymax*float64(h-top-bottom)) }
	for t := 0; t <= 5; t++ {
		v := ymax * float64(t) / 5
		y := py(v)
		line(img, left, y, w-right, y, grey)
		text(4, y+4, fmt.Sprintf("%9s", short(v)), black)
	}
	line(img, left, h-bottom, w-right, h-bottom, black)
	line(img, left, top, left, h-bottom, black)
	for i, l := range c.xlabels {
		line(img, px(i), h-bottom, px(i), h-bottom+5, black)
		text(px(i)-len(l)*7/2, h-bottom+20, l, black)
	}
	text(left, 20, c.title, black)
	text(left, h-12, "offered load (multiples of the capacity C)", black)
	text(w-right-len(c.ylabel)*7, 20, c.ylabel, black)
	for si, s := range c.series {
		prev := -1
		for i, v := range s.y {
			if math.IsNaN(v) {
				prev = -1
				continue
			}
			x, y := px(i), py(v)
			for dx := -2; dx <= 2; dx++ {
				for dy := -2; dy <= 2; dy++ {
					img.Set(x+dx, y+dy, s.color)
				}
			}
			if prev >= 0 {
				line(img, px(prev), py(s.y[prev]), x, y, s.color)
			}
			prev = i
		}
		text(left+10, top+16+16*si, "-- "+s.name, s.color)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

// line draws a line from (x0, y0) to (x1, y1), two pixels wide.
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	n := max(abs(x1-x0), abs(y1-y0), 1)
	for i := 0; i <= n; i++ {
		x := x0 + (x1-x0)*i/n
		y := y0 + (y1-y0)*i/n
		img.Set(x, y, c)
		img.Set(x, y+1, c)
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func short(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// OverloadPlots draws goodput, error rate and latency against offered
// load, one line per server (and per percentile), into dir.
func OverloadPlots(dir string, capacity float64, steps []Step) error {
	var multiples []float64
	var servers []string
	for _, s := range steps {
		if !slices.Contains(multiples, s.Multiple) {
			multiples = append(multiples, s.Multiple)
		}
		if !slices.Contains(servers, s.Server) {
			servers = append(servers, s.Server)
		}
	}
	xl := make([]string, len(multiples))
	for i, m := range multiples {
		xl[i] = fmt.Sprintf("%gC", m)
	}
	pick := func(server string, f func(Step) float64) []float64 {
		out := make([]float64, len(multiples))
		for i := range out {
			out[i] = math.NaN()
		}
		for _, s := range steps {
			if s.Server == server {
				out[slices.Index(multiples, s.Multiple)] = f(s)
			}
		}
		return out
	}
	goodput := chart{title: fmt.Sprintf("Goodput (C = %.0f/s)", capacity), ylabel: "successful requests/s", xlabels: xl}
	errs := chart{title: "Failed requests", ylabel: "% of requests sent", xlabels: xl}
	lat := chart{title: "Latency of successful requests", ylabel: "milliseconds", xlabels: xl}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for i, sv := range servers {
		c := palette[(2*i)%len(palette)]
		goodput.series = append(goodput.series, series{sv, c, pick(sv, func(s Step) float64 { return s.Goodput })})
		errs.series = append(errs.series, series{sv, c, pick(sv, func(s Step) float64 { return 100 * s.ErrorRate })})
		lat.series = append(lat.series,
			series{sv + " p50", c, pick(sv, func(s Step) float64 { return ms(s.P50) })},
			series{sv + " p99", palette[(2*i+1)%len(palette)], pick(sv, func(s Step) float64 { return ms(s.P99) })})
	}
	for name, c := range map[string]*chart{"overload-goodput.png": &goodput, "overload-errors.png": &errs, "overload-latency.png": &lat} {
		if err := c.draw(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}
