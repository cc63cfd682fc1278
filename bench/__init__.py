"""foldstream's benchmark: ``make bench`` (``python -m bench``), one module per figure.

Every figure is measured next to its reference in the same run, because the machines are shared
and absolute numbers drift with their load; the table shows both and their ratio.
"""
