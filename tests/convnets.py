"""Two small convolutional networks in ANF, shared by tests/test_lowlevel.py and
benchmarks/bench_lowlevel.py (which runs them at CIFAR's size).

``cnn``: conv with bias, batch norm, max and average pooling, a linear head.
``resnet``: a stem, a residual block with an identity shortcut, a downsampling
block with a 1x1 projection shortcut, global average pooling, a linear head.
Batch norm's variance is ``exp(lv)`` so that every drawn argument is valid; the
heads reshape to the pooled shape read off the tensor, so any batch and width work.
"""

NETS = """
def cnn(w1, b1, s1, o1, m1, lv1, w2, wf, x, y) =
  let h = relu(batch_norm(conv(x, w1, b1, padding=1), s1, o1, m1, exp(lv1))) in
  let p = max_pool(h, 2) in
  let h2 = relu(conv(p, w2, padding=1)) in
  let q = avg_pool(h2, 3, 1, padding=1) in
  let g = reshape(global_avg_pool(q), (shape(q)[0], shape(q)[1])) in
  let z = g @ wf in
  sum((z - y) * (z - y)) / 2.0

def bn(x, s, o, m, lv) = batch_norm(x, s, o, m, exp(lv))

def resnet(w0, s0, o0, m0, lv0, wa, sa, oa, ma, lva, wb, sb, ob, mb, lvb,
           wc, sc, oc, mc, lvc, wd, sd, od, md, lvd, wp, wf, x, y) =
  let h0 = max_pool(relu(bn(conv(x, w0, padding=1), s0, o0, m0, lv0)), 3, 2, padding=1) in
  let ha = relu(bn(conv(h0, wa, padding=1), sa, oa, ma, lva)) in
  let h1 = relu(bn(conv(ha, wb, padding=1), sb, ob, mb, lvb) + h0) in
  let hc = relu(bn(conv(h1, wc, stride=2, padding=1), sc, oc, mc, lvc)) in
  let h2 = relu(bn(conv(hc, wd, padding=1), sd, od, md, lvd) + conv(h1, wp, stride=2)) in
  let z = reshape(global_avg_pool(h2), (shape(h2)[0], shape(h2)[1])) @ wf in
  sum((z - y) * (z - y)) / 2.0
"""
