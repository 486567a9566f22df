"""Print the diff of named mutants against their originals: python showdiff.py <mutants/path.py> name..."""
import ast, difflib, sys
src = open(sys.argv[1]).read()
tree = ast.parse(src)
funcs = {}
for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        funcs[node.name] = ast.get_source_segment(src, node)
for name in sys.argv[2:]:
    fn = name.split(".")[-1]
    base = fn.rsplit("__mutmut_", 1)[0]
    cands = [k for k in funcs if k.endswith(fn)]
    orig = [k for k in funcs if k.endswith(base + "__mutmut_orig")]
    if not cands or not orig:
        print("??", name); continue
    a = funcs[orig[0]].splitlines()[1:]; b = funcs[cands[0]].splitlines()[1:]
    d = [l for l in difflib.unified_diff(a, b, lineterm="", n=0) if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    print("==", name); print("\n".join(d))
