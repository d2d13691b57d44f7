module upf.local/kneegen

go 1.22
