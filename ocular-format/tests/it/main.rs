mod roundtrip;
