"""Print each named mutant's changed lines against the original (run7_mutP)."""
import ast, sys, difflib
def funcs_of(path):
    src = open(path).read(); out = {}
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.get_source_segment(src, node)
    return out
cache = {}
for k in sys.argv[1:]:
    mod, name = k.split('.x', 1)[0], k.rsplit('.', 1)[-1]
    # module path from the key: everything before the function part
    parts = k.split('.')
    path = '/'.join(parts[:-1]) + '.py'
    if path not in cache: cache[path] = funcs_of(path)
    f = cache[path]
    orig = name.rsplit('__mutmut_', 1)[0] + '__mutmut_orig'
    a, b = f[orig].splitlines(), f[name].splitlines()
    d = [l for l in difflib.unified_diff(a, b, lineterm='', n=0) if l[:1] in '+-' and l[:3] not in ('---', '+++')]
    print('##', name.split('ǁ')[-1]); print('\n'.join(x.strip()[:240] for x in d[:6]))
