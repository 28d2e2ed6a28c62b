"""Views of a run's artifacts for people (Markdown and CSV tables, HTML pages, PNG figures); nothing
here writes artifacts. Each module holds one concern; imports run one way (load <- compare <-
markdown, plots <- write; heatmap_cards <- heatmap_colors <- heatmap_html, heatmap_png).

``rredcot report`` (finished training runs side by side):

- ``rredcot_cli.report.load``: reading finished runs (``RunResult``, ``load_run(s)``);
- ``rredcot_cli.report.compare``: grouping and statistics (``build_report``: labels, groups,
  means with intervals over seeds, the paired section);
- ``rredcot_cli.report.markdown``: ``report.md``, ``report.csv`` and ``credit_quality.csv`` as text;
- ``rredcot_cli.report.plots``: the matplotlib figures;
- ``rredcot_cli.report.write``: ``write_report``, every file of a report into a folder.

``rredcot heatmap`` (completions coloured by token advantage / segment credit, with segment
boundaries, the value curve V(S_k) and the first wrong step):

- ``rredcot_cli.report.heatmap_cards``: choosing completions and building each one's card;
- ``rredcot_cli.report.heatmap_colors``: the page's diverging colour scale;
- ``rredcot_cli.report.heatmap_html``: the self-contained HTML page;
- ``rredcot_cli.report.heatmap_png``: the PNG figure.
"""
