fn main() {
    println!("kvfence-sim: not built yet");
}
