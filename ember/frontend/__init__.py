"""PyTorch -> ember IR: the Dynamo backend, AOTAutograd wiring and the ATen lowering table."""
