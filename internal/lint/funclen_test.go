package lint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// MaxFuncLines is the most lines a function of the module may take, from
// its func keyword to its closing brace (its doc comment not counted): a
// longer one is split into named steps.
const MaxFuncLines = 100

// moduleRoot is the module's root, relative to this package. Every
// package below it (the core, the root's Caddy skin, mockllm, internal/soak,
// the commands) is bounded by MaxFuncLines; tests, testdata and the
// modules of their own below it (caddytest, bench: a go.mod of theirs) are
// not.
const moduleRoot = "../.."

// longFunc is a function over the bound: where it starts and its length.
type longFunc struct {
	pos   token.Position
	name  string
	lines int
}

func (f longFunc) String() string {
	return fmt.Sprintf("%s:%d: %s is %d lines (at most %d)", f.pos.Filename, f.pos.Line, f.name, f.lines, MaxFuncLines)
}

// longFuncs returns the functions of one parsed file longer than limit
// lines: declared functions and methods, and function literals (a literal
// inside a function counts toward that function as well).
func longFuncs(fset *token.FileSet, f *ast.File, limit int) []longFunc {
	var long []longFunc
	ast.Inspect(f, func(n ast.Node) bool {
		var name string
		var body *ast.BlockStmt
		switch n := n.(type) {
		case *ast.FuncDecl:
			name, body = funcName(n), n.Body
		case *ast.FuncLit:
			name, body = "a function literal", n.Body
		}
		if body == nil {
			return true
		}
		start := fset.Position(n.Pos())
		if lines := fset.Position(body.End()).Line - start.Line + 1; lines > limit {
			long = append(long, longFunc{pos: start, name: name, lines: lines})
		}
		return true
	})
	return long
}

// funcName is a declared function's name as the code calls it: "F", or
// "T.M" for a method.
func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if g, ok := t.(*ast.IndexExpr); ok { // a generic type's method
		t = g.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + d.Name.Name
	}
	return d.Name.Name
}

// TestFunctionsAreShort fails for every function of the module longer
// than MaxFuncLines, naming it with its file:line and length.
func TestFunctionsAreShort(t *testing.T) {
	fset := token.NewFileSet()
	files := map[string]bool{} // the directories read
	err := filepath.WalkDir(moduleRoot, func(path string, e fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case e.IsDir() && (e.Name() == "testdata" || path != moduleRoot && hasGoMod(path)):
			return filepath.SkipDir
		case e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files[filepath.Dir(path)] = true
		for _, long := range longFuncs(fset, f, MaxFuncLines) {
			t.Error(long)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the module: %v", err)
	}
	for _, dir := range []string{".", "internal/router", "internal/api", "provider", "mockllm", "internal/soak"} {
		if !files[filepath.Join(moduleRoot, dir)] {
			t.Errorf("read no file of %s: are the paths right?", dir)
		}
	}
}

// hasGoMod reports whether dir holds a module of its own.
func hasGoMod(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// TestLongFuncsCounts checks the count itself on a known source: a
// function of limit lines passes, one of limit+1 does not, a long function
// literal is found in a short function's var, a method is named with its
// type.
func TestLongFuncsCounts(t *testing.T) {
	body := func(n int) string { // a function of n lines in all
		return strings.Repeat("\tx++\n", n-2)
	}
	src := "package p\n\n" +
		"func fits() {\n" + body(5) + "}\n\n" +
		"func (t *T) over() {\n" + body(6) + "}\n\n" +
		"var lit = func() {\n" + body(6) + "}\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	long := longFuncs(fset, f, 5)
	var got []string
	for _, l := range long {
		got = append(got, fmt.Sprintf("%s:%d:%d", l.name, l.pos.Line, l.lines))
	}
	want := []string{"T.over:9:6", "a function literal:16:6"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("expected %v, got %v", want, got)
	}
}
