"""The linear probe: StandardScaler + L2 logistic regression, with the scikit-learn estimator contract
(usable in `cross_val_score`, `GridSearchCV`, `clone`)."""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from fbt_probe.errors import FbtError
from fbt_probe.probes.direction import ProbeDirection


class LinearProbe(ClassifierMixin, BaseEstimator):
    """Logistic-regression probe on standardized features (docs/probes.md).

    A scikit-learn estimator (`clone`, `cross_val_score`, `GridSearchCV` work); `export` freezes a
    fitted binary probe into a raw-space `ProbeDirection`.

    Parameters
    ----------
    C : float, default 1.0
        Inverse L2 strength, as in `LogisticRegression` (objective ``C·Σ loss + ½‖w‖²``).
    max_iter : int, default 1000
        lbfgs iterations at most.
    tol : float, default 1e-4
        lbfgs stopping tolerance.
    standardize : bool, default True
        Fit a `StandardScaler` first (constant features get scale 1).

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The labels seen in `fit`.
    coef_ : ndarray of shape (1, n_features)
        Weights on the standardized features.
    intercept_ : ndarray of shape (1,)
        Bias on the standardized features.
    scaler_ : StandardScaler or None
        The fitted scaler (None when `standardize` is False).
    n_iter_ : int
        lbfgs iterations used.
    n_features_in_ : int
        Width of the activations it was fitted on.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> y = np.tile([0, 1], 50)
    >>> X = rng.normal(size=(100, 8)) + 3.0 * y[:, None] * np.eye(8)[0]   # the label along feature 0
    >>> probe = LinearProbe(C=1.0).fit(X, y)
    >>> probe.score(X, y) > 0.9
    True
    >>> d = probe.export(hook="blocks.0.hook_resid_pre")
    >>> int(np.argmax(np.abs(d.direction))), bool((d.predict(X) == probe.predict(X)).all())
    (0, True)
    """

    def __init__(self, C: float = 1.0, max_iter: int = 1000, tol: float = 1e-4, standardize: bool = True):
        self.C = C
        self.max_iter = max_iter
        self.tol = tol
        self.standardize = standardize

    def fit(self, X, y):
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32])
        check_classification_targets(y)
        self.scaler_ = StandardScaler().fit(X) if self.standardize else None
        self.logreg_ = LogisticRegression(C=self.C, max_iter=self.max_iter, tol=self.tol)
        self.logreg_.fit(self._transform(X), y)
        self.classes_ = self.logreg_.classes_
        self.coef_ = self.logreg_.coef_
        self.intercept_ = self.logreg_.intercept_
        self.n_iter_ = int(np.max(self.logreg_.n_iter_))
        return self

    def _transform(self, X):
        return self.scaler_.transform(X) if self.scaler_ is not None else X

    def _checked(self, X):
        check_is_fitted(self)
        return self._transform(validate_data(self, X, reset=False, dtype=[np.float64, np.float32]))

    def decision_function(self, X):
        Xs = self._checked(X)  # checks fitted-ness before logreg_ is touched
        return self.logreg_.decision_function(Xs)

    def predict(self, X):
        Xs = self._checked(X)  # checks fitted-ness before logreg_ is touched
        return self.logreg_.predict(Xs)

    def predict_proba(self, X):
        Xs = self._checked(X)  # checks fitted-ness before logreg_ is touched
        return self.logreg_.predict_proba(Xs)

    def export(self, hook: str | None = None, **meta) -> ProbeDirection:
        """The fitted binary probe as a frozen `ProbeDirection` in the raw activation space."""
        check_is_fitted(self)
        if len(self.classes_) != 2:
            raise ValueError(f"export needs a binary probe, this one has classes {list(self.classes_)}")
        d = self.n_features_in_
        mean = self.scaler_.mean_ if self.scaler_ is not None else np.zeros(d)
        scale = self.scaler_.scale_ if self.scaler_ is not None else np.ones(d)
        return ProbeDirection(
            weights=self.coef_[0],
            bias=float(self.intercept_[0]),
            mean=mean,
            scale=scale,
            classes=tuple(self.classes_.tolist()),
            hook=hook,
            meta=meta,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


def fit_binary(X, y, C: float = 1.0) -> ProbeDirection:
    """A `LinearProbe` fitted on labels 0/1, exported as its raw-space `ProbeDirection`
    (`.direction`, `.predict`): what erasure, steering and DAS's probe comparison use."""
    p = LinearProbe(C=C).fit(X, y).export()
    if tuple(p.classes) != (0, 1):
        raise FbtError(f"probe classes {p.classes}: expected (0, 1)")
    return p
