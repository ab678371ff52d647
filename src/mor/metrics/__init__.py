"""Pure metrics (layer: model/data level; numpy/torch functions of arrays, no files, no jobs).

Reports and claims may import these, as they may any pure function.
"""
