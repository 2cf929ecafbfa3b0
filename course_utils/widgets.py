"""Interactive controls (ipywidgets) used in the notebooks."""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from IPython.display import display

from course_utils.autograd import LineFit, fit_line
from course_utils.plotting import plot_line_fit, plot_losses


class RegressionExplorer:
    """Sliders for the learning rate and number of steps of `fit_line`; redraws fit and loss on change.

    Display it as the last expression of a cell. `last_fit` holds the most recent `LineFit`.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, lr: float = 0.1, steps: int = 200) -> None:
        self.x, self.y = x, y
        self.lr = widgets.FloatLogSlider(value=lr, base=10, min=-3, max=0.4, step=0.05,
                                         description="learning rate", readout_format=".3f",
                                         continuous_update=False)
        self.steps = widgets.IntSlider(value=steps, min=10, max=1000, step=10, description="steps",
                                       continuous_update=False)
        self.output = widgets.Output()
        self.last_fit: LineFit | None = None
        self.lr.observe(self._redraw, names="value")
        self.steps.observe(self._redraw, names="value")
        self.widget = widgets.VBox([widgets.HBox([self.lr, self.steps]), self.output])
        self._redraw()

    def _redraw(self, _change: object = None) -> None:
        self.last_fit = fit = fit_line(self.x, self.y, lr=self.lr.value, steps=self.steps.value)
        self.output.clear_output(wait=True)
        with self.output:
            fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
            plot_line_fit(self.x, self.y, fit.w, fit.b, ax=left)
            plot_losses({f"lr={self.lr.value:.3f}": fit.losses}, ax=right,
                        title="diverged!" if fit.diverged else "loss")
            display(fig)
            plt.close(fig)
            print(fit)

    def _ipython_display_(self) -> None:
        display(self.widget)
