package lint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// MaxFuncLines is the most lines a function of the core may take, from its
// func keyword to its closing brace (its doc comment not counted): a longer
// one is split into named steps.
const MaxFuncLines = 100

// core lists the directories, relative to the module's root, whose
// functions (their packages and the packages below them) MaxFuncLines
// bounds. Tests and testdata are not bounded.
var core = []string{
	"internal/router",
	"internal/capacity",
	"internal/adapters",
	"internal/api",
	"internal/wire",
	"provider",
}

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

// TestCoreFunctionsAreShort fails for every function of the core longer
// than MaxFuncLines, naming it with its file:line and length.
func TestCoreFunctionsAreShort(t *testing.T) {
	fset := token.NewFileSet()
	files := 0
	for _, dir := range core {
		root := filepath.Join("..", "..", dir)
		err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			switch {
			case err != nil:
				return err
			case e.IsDir() && e.Name() == "testdata":
				return filepath.SkipDir
			case e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			files++
			for _, long := range longFuncs(fset, f, MaxFuncLines) {
				t.Error(long)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("reading %s: %v", dir, err)
		}
	}
	if files < 50 {
		t.Fatalf("read %d files of the core, expected far more: are the paths right?", files)
	}
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
