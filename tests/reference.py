"""NumPy implementations of the equations of docs/SPEC.md, written from the paper's
formulas one sentence at a time (no batching, no padding), to check the
TensorFlow layers against."""

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def layer_norm(v, gain, bias, eps=1e-5):
    mean = v.mean(-1, keepdims=True)
    return (v - mean) / np.sqrt(((v - mean) ** 2).mean(-1, keepdims=True) + eps) * gain + bias


def gru_step(x, h, W, U, b, C=None, c=None, m=None, norms=None):
    """docs/SPEC.md §1: W [d, 3n], U [n, 3n], b [3n], gates [r, z, candidate]; m: a
    recurrent dropout mask on h where it meets U (the update keeps h).

    norms: layer normalisation (Nematus style), {"input" | "recurrent" |
    "context": (gain [3n], bias [3n])}: each term normalised on its own,
    the [r, z] part (2n) apart from the candidate part (n)."""
    n = h.shape[-1]
    hd = h if m is None else h * m

    def norm(term, v, part):        # part: slice of the 3n units that v covers
        if norms is None:
            return v
        gain, bias = norms[term]
        return layer_norm(v, gain[part], bias[part])

    rz, cand = slice(0, 2 * n), slice(2 * n, 3 * n)
    x_proj = x @ W + b
    x_rz, x_h = norm("input", x_proj[rz], rz), norm("input", x_proj[cand], cand)
    c_rz = c_h = 0.0
    if C is not None:
        c_proj = c @ C
        c_rz, c_h = norm("context", c_proj[rz], rz), norm("context", c_proj[cand], cand)
    gates = sigmoid(x_rz + norm("recurrent", hd @ U[:, rz], rz) + c_rz)
    r, z = gates[:n], gates[n:]
    h_tilde = np.tanh(x_h + norm("recurrent", (r * hd) @ U[:, cand], cand) + c_h)
    return (1.0 - z) * h + z * h_tilde


def transition_gru_step(h, U, b, m=None, norms=None):
    """A GRU without input (a deep transition's step after its first):
    gru_step with no x-term, the bias b in its place. norms: {"recurrent":
    (gain, bias)} or None."""
    n = h.shape[-1]
    hd = h if m is None else h * m

    def norm(v, part):
        return v if norms is None else layer_norm(v, norms["recurrent"][0][part], norms["recurrent"][1][part])

    rz, cand = slice(0, 2 * n), slice(2 * n, 3 * n)
    gates = sigmoid(b[rz] + norm(hd @ U[:, rz], rz))
    r, z = gates[:n], gates[n:]
    h_tilde = np.tanh(b[cand] + norm((r * hd) @ U[:, cand], cand))
    return (1.0 - z) * h + z * h_tilde


def bidirectional_gru(xs, fw, bw, fw_norms=None, bw_norms=None):
    """xs [T, d] of ONE sentence (no padding); fw / bw = (W, U, b); *_norms: see
    gru_step. Returns [T, 2n]."""
    n = fw[1].shape[0]
    h, forward = np.zeros(n), []
    for x in xs:
        h = gru_step(x, h, *fw, norms=fw_norms)
        forward.append(h)
    h, backward = np.zeros(n), []
    for x in xs[::-1]:
        h = gru_step(x, h, *bw, norms=bw_norms)
        backward.append(h)
    return np.concatenate([np.array(forward), np.array(backward[::-1])], axis=-1)


def attention(s_prev, H, Wa, Ua, ba, va):
    """e_j = v_a^T tanh(W_a s + U_a h_j + b_a); returns (c, alpha) for ONE sentence H [T, 2n]."""
    e = np.tanh(s_prev @ Wa + H @ Ua + ba) @ va
    alpha = np.exp(e - e.max())
    alpha /= alpha.sum()
    return alpha @ H, alpha


def maxout(s, y_emb, c, Uo, Vo, Co, bo):
    t_tilde = s @ Uo + y_emb @ Vo + c @ Co + bo
    return np.maximum(t_tilde[..., 0::2], t_tilde[..., 1::2])


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def rnnsearch_forward(w, source, target_in):
    """Teacher-forced RNNsearch for ONE sentence pair with weights `w` (dict).

    Returns (logits [Ty, K], alignments [Ty, Tx]).
    """
    n = w["enc_fw"][1].shape[0]
    H = bidirectional_gru(w["src_emb"][source], w["enc_fw"], w["enc_bw"])
    for fw, bw in w.get("enc_upper", []):      # encoder_layers > 1: residual layers
        H = H + bidirectional_gru(H, fw, bw)
    s = np.tanh(H[0, n:] @ w["Ws"] + w["bs"])
    logits, alphas = [], []
    for y_prev in target_in:
        e_y = w["tgt_emb"][y_prev]
        if "transition" in w:
            # Nematus' cGRU: s' = GRU_1(s, E y), attention from s', s = GRU_2(s', c), c as GRU_2's input.
            s_mid = gru_step(e_y, s, *w["transition"])
            c, alpha = attention(s_mid, H, *w["att"])
            s = gru_step(c, s_mid, *w["dec"])
            for deep in w["deep"]:              # a deep transition: GRU_3 .. GRU_d, no input
                s = transition_gru_step(s, *deep)
        else:
            c, alpha = attention(s, H, *w["att"])
            s = gru_step(e_y, s, *w["dec"], c=c)
        t = maxout(s, e_y, c, *w["readout"])
        logits.append(t @ w["Wo"] + w["bo"])
        alphas.append(alpha)
    return np.array(logits), np.array(alphas)


def rnnsearch_weights(model):
    """Pulls the weights of an `nmt_tf.models.rnnsearch.RNNSearch` into the dict above."""
    g = lambda v: np.asarray(v.numpy(), dtype=np.float64)
    enc, dec = model.encoder, model.decoder
    ro = model.readout
    cgru = hasattr(dec, "transition")
    return {
        "src_emb": g(model.source_embedding.embeddings),
        "tgt_emb": g(model.target_embedding.embeddings),
        "enc_fw": (g(enc.kernels[0]), g(enc.recurrent_kernels[0]), g(enc.biases[0])),
        "enc_bw": (g(enc.kernels[1]), g(enc.recurrent_kernels[1]), g(enc.biases[1])),
        "enc_upper": [tuple((g(layer.kernels[i]), g(layer.recurrent_kernels[i]), g(layer.biases[i]))
                            for i in (0, 1)) for layer in model.encoders[1:]],
        "Ws": g(model.initial_state.kernel), "bs": g(model.initial_state.bias),
        "att": (g(dec.attention.query_kernel), g(dec.attention.key_kernel),
                g(dec.attention.bias), g(dec.attention.score_vector)),
        "dec": (g(dec.cell.kernel), g(dec.cell.recurrent_kernel), g(dec.cell.bias),
                *([] if cgru else [g(dec.cell.context_kernel)])),
        **({"transition": (g(dec.transition.kernel), g(dec.transition.recurrent_kernel), g(dec.transition.bias))}
           if cgru else {}),
        "deep": [(g(cell.recurrent_kernel), g(cell.bias)) for cell in
                 (getattr(dec, name) for name in dec._deep_names())] if cgru else [],
        "readout": (g(ro.state_kernel), g(ro.embedding_kernel), g(ro.context_kernel), g(ro.bias)),
        # Tied embeddings: W_o is E_y^T.
        "Wo": g(model.output_weights()[0]), "bo": g(model.output_weights()[1]),
    }


def grconv(xs, U, bu, Wl, Wr, b, Gl, Gr, gb):
    """Paper 002 §2.2 (docs/SPEC.md §4) for ONE sentence xs [T, m]: (root [d], gates per level [[T-t, 3], ...])."""
    h = xs @ U + bu
    levels = []
    while len(h) > 1:
        left, right = h[:-1], h[1:]
        candidate = np.maximum(0.0, left @ Wl + right @ Wr + b)
        g = left @ Gl + right @ Gr + gb
        g = np.exp(g - g.max(-1, keepdims=True))
        g /= g.sum(-1, keepdims=True)
        h = g[:, 0:1] * candidate + g[:, 1:2] * left + g[:, 2:3] * right
        levels.append(g)
    return h[0], levels
