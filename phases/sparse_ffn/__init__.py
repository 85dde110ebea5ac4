"""Phase sparse_ffn: a fixed-slice FFN backward (dX from the first N rows of dY; numerically WRONG for
training) in Triton, alone against cuBLAS and inside BERT/RoBERTa."""
