"""Analysis on top of captured values (pipeline layer): why a layer differs (`causes`, numpy only) and
fault injection into exported ONNX graphs (`faults`, onnx only). Nothing is imported here, so a light
stage importing `parity.analysis.causes` pays for numpy alone."""
