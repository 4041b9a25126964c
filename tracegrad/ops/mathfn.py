"""NumPy implementations of math functions NumPy lacks (erf).

erf uses Cephes' rational approximations (S. Moshier, public domain): erf on |x| <= 1,
erfc on 1 < |x| < 8 and |x| >= 8. Accurate to a few ulp in float64.
"""

from __future__ import annotations

import numpy as np

_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
      7.00332514112805075473e3, 5.55923013010394962768e4)
_U = (1.0, 3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
      2.26290000613890934246e4, 4.92673942608635921086e4)
_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
      4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
      9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
      9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
      1.65666309194161350182e3, 5.57535340817727675546e2)
_R = (5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
      6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0)
_S = (1.0, 2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1,
      1.70814450747565897222e1, 9.60896809063285878198e0, 3.36907645100081516050e0)


def _polyval(coefficients, x):
    result = np.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        result = result * x + c
    return result


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf, in the input's float dtype (computed in float64)."""
    x = np.asarray(x)
    out_dtype = x.dtype
    x64 = x.astype(np.float64)
    # Beyond |x| = 30, erfc underflows; clipping keeps the rational terms finite at inf.
    ax = np.minimum(np.abs(x64), 30.0)
    small = ax <= 1.0
    z = x64 * x64
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        erf_small = x64 * _polyval(_T, z) / _polyval(_U, z)
        mid = ax < 8.0
        p = np.where(mid, _polyval(_P, ax), _polyval(_R, ax))
        q = np.where(mid, _polyval(_Q, ax), _polyval(_S, ax))
        erfc_large = np.exp(-z) * p / q
    erf_large = np.copysign(1.0 - erfc_large, x64)
    result = np.where(small, erf_small, erf_large)
    result = np.where(np.isnan(x64), np.nan, result)
    return result.astype(out_dtype, copy=False)
