"""Views of a run's artifacts for people (HTML pages, PNG figures); nothing here writes artifacts.

- ``rredcot_cli.report.heatmap``: completions coloured by token advantage / segment credit, with
  segment boundaries, the value curve V(S_k) and the first wrong step (``rredcot heatmap``).
"""
