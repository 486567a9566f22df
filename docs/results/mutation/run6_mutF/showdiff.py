import ast, sys, difflib
src = open(sys.argv[1]).read(); tree = ast.parse(src)
funcs = {}
for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef,)):
        funcs[node.name] = ast.get_source_segment(src, node)
for k in open(sys.argv[2]).read().split():
    name = k.split('.')[-1]
    orig = name.rsplit('__mutmut_', 1)[0] + '__mutmut_orig'
    a, b = funcs[orig].splitlines(), funcs[name].splitlines()
    d = [l for l in difflib.unified_diff(a, b, lineterm='', n=0) if l[:1] in '+-' and l[:3] not in ('---', '+++')]
    print('##', name.split('ǁ')[-1]); print('\n'.join(x[:200] for x in d[1:] if True) if False else '\n'.join(x.strip()[:220] for x in d[:4]))
