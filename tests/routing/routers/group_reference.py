"""The group-limited routing rule, one token at a time (a test reference shared by the router tests):
each group scores by the sum of its best `score_top` scores; the best `topk_groups` groups are kept
(ties: the lower group first)."""


def kept_groups(row: list, n_groups: int, topk_groups: int, score_top: int) -> list:
    per = len(row) // n_groups
    score = [sum(sorted(row[g * per:(g + 1) * per], reverse=True)[:score_top]) for g in range(n_groups)]
    return sorted(range(n_groups), key=lambda g: -score[g])[:topk_groups]
